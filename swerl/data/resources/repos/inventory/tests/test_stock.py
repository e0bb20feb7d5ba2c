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
