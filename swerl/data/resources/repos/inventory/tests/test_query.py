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
