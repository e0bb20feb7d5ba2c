import pytest

from textkit import camel_to_snake, capitalize_words, snake_to_camel


def test_camel_to_snake_simple():
    assert camel_to_snake("parseHttpHeader") == "parse_http_header"


def test_camel_to_snake_leading_upper():
    assert camel_to_snake("Parse") == "parse"


def test_camel_to_snake_keeps_existing_underscore():
    assert camel_to_snake("a_B") == "a_b"


def test_snake_to_camel():
    assert snake_to_camel("parse_http_header") == "parseHttpHeader"


def test_snake_to_camel_upper_first():
    assert snake_to_camel("parse_http", upper_first=True) == "ParseHttp"


def test_snake_to_camel_empty():
    assert snake_to_camel("__") == ""


@pytest.mark.parametrize("text,expected", [("a bc def", "A Bc Def"), ("", "")])
def test_capitalize_words(text, expected):
    assert capitalize_words(text) == expected


def test_capitalize_words_min_length():
    assert capitalize_words("a bc def", min_length=3) == "a bc Def"
