"""Inventory records as dicts with sku, name, qty, price (cents) and category."""

from inventory.query import by_category, filter_items, search, sort_items, top_n
from inventory.stock import low_stock, reorder_quantity, restock, total_value, withdraw

__all__ = [
    "by_category",
    "filter_items",
    "low_stock",
    "reorder_quantity",
    "restock",
    "search",
    "sort_items",
    "top_n",
    "total_value",
    "withdraw",
]
