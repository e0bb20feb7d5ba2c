import pytest

from textkit import common_prefix, hamming, levenshtein


def test_hamming():
    assert hamming("karolin", "kathrin") == 3


def test_hamming_equal():
    assert hamming("abc", "abc") == 0


def test_hamming_length_mismatch():
    with pytest.raises(ValueError):
        hamming("a", "ab")


@pytest.mark.parametrize(
    "a,b,d", [("kitten", "sitting", 3), ("", "abc", 3), ("flaw", "lawn", 2), ("same", "same", 0)]
)
def test_levenshtein(a, b, d):
    assert levenshtein(a, b) == d


def test_common_prefix():
    assert common_prefix(["interview", "internet", "interval"]) == "inter"


def test_common_prefix_none_shared():
    assert common_prefix(["abc", "xyz"]) == ""


def test_common_prefix_empty_list():
    assert common_prefix([]) == ""
