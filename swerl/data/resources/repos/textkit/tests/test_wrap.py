import pytest

from textkit import center, truncate, wrap_words


def test_truncate_short_text_unchanged():
    assert truncate("hello", 5) == "hello"


def test_truncate_cuts_with_suffix():
    assert truncate("hello world", 8) == "hello..."


def test_truncate_rejects_tiny_width():
    with pytest.raises(ValueError):
        truncate("hello", 2)


def test_wrap_words():
    assert wrap_words("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_words_exact_fit():
    assert wrap_words("ab cd", 5) == ["ab cd"]


def test_wrap_words_long_word():
    assert wrap_words("a verylongword b", 4) == ["a", "verylongword", "b"]


def test_wrap_words_rejects_zero_width():
    with pytest.raises(ValueError):
        wrap_words("a", 0)


def test_center_odd_padding_goes_right():
    assert center("ab", 5, "*") == "*ab**"


def test_center_wide_text_unchanged():
    assert center("abcdef", 3) == "abcdef"
