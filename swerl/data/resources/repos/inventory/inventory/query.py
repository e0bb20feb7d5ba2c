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
