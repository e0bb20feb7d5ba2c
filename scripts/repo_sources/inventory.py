"""inventory: stock records."""

DESCRIPTION = "Stock records: filtering, sorting, reorder points, valuation."

FILES = {
    "inventory/__init__.py": '''
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
''',
    "inventory/query.py": '''
"""Selecting and ordering records."""


def filter_items(items, min_qty=None, max_price=None, category=None):
    """Records matching every given criterion."""
    result = []
    for item in items:
        if min_qty is not None and item["qty"] < min_qty:
            continue
        if max_price is not None and item["price"] > max_price:
            continue
        if category is not None and item["category"] != category:
            continue
        result.append(item)
    return result


def sort_items(items, key="name", descending=False):
    """Records ordered by `key`, ties broken by sku."""
    return sorted(items, key=lambda item: (item[key], item["sku"]), reverse=descending)


def top_n(items, n, key="qty"):
    """The n records with the largest `key`."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return sort_items(items, key=key, descending=True)[:n]


def by_category(items):
    """category -> list of skus, categories and skus sorted."""
    groups = {}
    for item in items:
        groups.setdefault(item["category"], []).append(item["sku"])
    return {category: sorted(skus) for category, skus in sorted(groups.items())}


def search(items, text):
    """Records whose name contains `text`, case-insensitively."""
    needle = text.lower()
    return [item for item in items if needle in item["name"].lower()]
''',
    "inventory/stock.py": '''
"""Quantities and value."""


def total_value(items):
    """Sum of qty * price in cents."""
    return sum(item["qty"] * item["price"] for item in items)


def low_stock(items, threshold):
    """Skus whose quantity is at or below threshold, sorted."""
    return sorted(item["sku"] for item in items if item["qty"] <= threshold)


def reorder_quantity(qty, target, pack_size):
    """Units to order to reach `target`, rounded up to whole packs."""
    if pack_size <= 0:
        raise ValueError("pack_size must be positive")
    missing = target - qty
    if missing <= 0:
        return 0
    packs = (missing + pack_size - 1) // pack_size
    return packs * pack_size


def restock(item, units):
    """A copy of the record with `units` more in stock."""
    if units < 0:
        raise ValueError("units must be >= 0")
    updated = dict(item)
    updated["qty"] = item["qty"] + units
    return updated


def withdraw(item, units):
    """A copy with `units` fewer; refuses to go below zero."""
    if units > item["qty"]:
        raise ValueError("not enough stock")
    updated = dict(item)
    updated["qty"] = item["qty"] - units
    return updated
''',
    "tests/conftest.py": """
import pytest


@pytest.fixture
def items():
    return [
        {"sku": "A1", "name": "Steel Bolt", "qty": 120, "price": 15, "category": "hardware"},
        {"sku": "B2", "name": "Wood Screw", "qty": 8, "price": 10, "category": "hardware"},
        {"sku": "C3", "name": "Paint Brush", "qty": 25, "price": 450, "category": "paint"},
        {"sku": "D4", "name": "Bolt Cutter", "qty": 3, "price": 2999, "category": "tools"},
        {"sku": "E5", "name": "Roller", "qty": 25, "price": 699, "category": "paint"},
    ]
""",
    "tests/test_query.py": """
import pytest

from inventory import by_category, filter_items, search, sort_items, top_n


def test_filter_min_qty(items):
    assert [i["sku"] for i in filter_items(items, min_qty=25)] == ["A1", "C3", "E5"]


def test_filter_max_price(items):
    assert [i["sku"] for i in filter_items(items, max_price=450)] == ["A1", "B2", "C3"]


def test_filter_category(items):
    assert [i["sku"] for i in filter_items(items, category="paint")] == ["C3", "E5"]


def test_filter_combined(items):
    assert [i["sku"] for i in filter_items(items, min_qty=10, category="hardware")] == ["A1"]


def test_sort_by_name(items):
    assert [i["sku"] for i in sort_items(items)] == ["D4", "C3", "E5", "A1", "B2"]


def test_sort_ties_by_sku(items):
    assert [i["sku"] for i in sort_items(items, key="qty")] == ["D4", "B2", "C3", "E5", "A1"]


def test_sort_descending(items):
    assert sort_items(items, key="price", descending=True)[0]["sku"] == "D4"


def test_top_n(items):
    assert [i["sku"] for i in top_n(items, 2)] == ["A1", "E5"]


def test_top_n_negative(items):
    with pytest.raises(ValueError):
        top_n(items, -1)


def test_by_category(items):
    assert by_category(items) == {"hardware": ["A1", "B2"], "paint": ["C3", "E5"], "tools": ["D4"]}


def test_search_case_insensitive(items):
    assert [i["sku"] for i in search(items, "bolt")] == ["A1", "D4"]
""",
    "tests/test_stock.py": """
import pytest

from inventory import low_stock, reorder_quantity, restock, total_value, withdraw


def test_total_value(items):
    assert total_value(items) == 120 * 15 + 8 * 10 + 25 * 450 + 3 * 2999 + 25 * 699


def test_low_stock_inclusive(items):
    assert low_stock(items, 8) == ["B2", "D4"]


def test_reorder_rounds_up_to_pack():
    assert reorder_quantity(3, 20, 6) == 18


def test_reorder_exact_pack():
    assert reorder_quantity(8, 20, 6) == 12


def test_reorder_nothing_missing():
    assert reorder_quantity(30, 20, 6) == 0


def test_reorder_bad_pack():
    with pytest.raises(ValueError):
        reorder_quantity(1, 2, 0)


def test_restock(items):
    assert restock(items[1], 10)["qty"] == 18 and items[1]["qty"] == 8


def test_restock_negative(items):
    with pytest.raises(ValueError):
        restock(items[0], -1)


def test_withdraw(items):
    assert withdraw(items[3], 3)["qty"] == 0


def test_withdraw_too_many(items):
    with pytest.raises(ValueError):
        withdraw(items[3], 4)
""",
}
