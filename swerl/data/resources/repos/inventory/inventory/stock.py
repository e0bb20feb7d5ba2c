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
