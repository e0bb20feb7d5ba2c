import pytest

from money import add, format_amount, multiply, parse_amount, percent_of, round_half_even


@pytest.mark.parametrize("num,den,expected", [(5, 2, 2), (7, 2, 4), (6, 4, 2), (7, 4, 2), (9, 4, 2), (-5, 2, -2)])
def test_round_half_even(num, den, expected):
    assert round_half_even(num, den) == expected


def test_round_half_even_bad_denominator():
    with pytest.raises(ValueError):
        round_half_even(1, 0)


@pytest.mark.parametrize("text,cents", [("12.34", 1234), ("5", 500), ("0.5", 50), ("-1.05", -105), (".07", 7)])
def test_parse_amount(text, cents):
    assert parse_amount(text) == cents


def test_parse_amount_too_many_decimals():
    with pytest.raises(ValueError):
        parse_amount("1.234")


def test_format_amount():
    assert format_amount(1234567) == "$12,345.67"


def test_format_amount_small_and_negative():
    assert format_amount(-5, symbol="EUR ") == "-EUR 0.05"


def test_format_amount_exact_thousand():
    assert format_amount(100000) == "$1,000.00"


def test_add():
    assert add(100, 250, -50) == 300


def test_multiply_rounds():
    assert multiply(105, 1, 2) == 52


def test_percent_of():
    assert percent_of(1999, 15) == 300
