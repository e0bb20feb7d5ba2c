"""textkit: small string utilities."""

DESCRIPTION = "Small string utilities: casing, wrapping, tokens, edit distance."

FILES = {
    "textkit/__init__.py": '''
"""Small string utilities."""

from textkit.case import camel_to_snake, capitalize_words, snake_to_camel
from textkit.measure import common_prefix, hamming, levenshtein
from textkit.wrap import center, truncate, wrap_words

__all__ = [
    "camel_to_snake",
    "capitalize_words",
    "center",
    "common_prefix",
    "hamming",
    "levenshtein",
    "snake_to_camel",
    "truncate",
    "wrap_words",
]
''',
    "textkit/case.py": '''
"""Identifier casing conversions."""


def camel_to_snake(name):
    """'parseHttpHeader' -> 'parse_http_header'."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            if i > 0 and name[i - 1] != "_":
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def snake_to_camel(name, upper_first=False):
    """'parse_http_header' -> 'parseHttpHeader' (or 'ParseHttpHeader')."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(p.capitalize() for p in parts[1:])


def capitalize_words(text, min_length=1):
    """Capitalize every word at least `min_length` characters long."""
    words = text.split(" ")
    result = []
    for word in words:
        if len(word) >= min_length:
            result.append(word[:1].upper() + word[1:])
        else:
            result.append(word)
    return " ".join(result)
''',
    "textkit/wrap.py": '''
"""Fitting text into a width."""


def truncate(text, width, suffix="..."):
    """Cut `text` to at most `width` characters, ending in `suffix` when cut."""
    if width < len(suffix):
        raise ValueError("width shorter than suffix")
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def wrap_words(text, width):
    """Greedy word wrap into lines of at most `width` characters (long words get their own line)."""
    if width <= 0:
        raise ValueError("width must be positive")
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def center(text, width, fill=" "):
    """Center `text` in `width`, extra padding going to the right."""
    if len(text) >= width:
        return text
    total = width - len(text)
    left = total // 2
    right = total - left
    return fill * left + text + fill * right
''',
    "textkit/measure.py": '''
"""Distances and overlaps between strings."""


def hamming(a, b):
    """Number of positions where equal-length strings differ."""
    if len(a) != len(b):
        raise ValueError("strings differ in length")
    count = 0
    for i in range(len(a)):
        if a[i] != b[i]:
            count += 1
    return count


def levenshtein(a, b):
    """Edit distance with unit-cost insertions, deletions and substitutions."""
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
        previous = current
    return previous[len(b)]


def common_prefix(words):
    """Longest prefix shared by every word."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        n = 0
        while n < len(prefix) and n < len(word) and prefix[n] == word[n]:
            n += 1
        prefix = prefix[:n]
    return prefix
''',
    "tests/test_case.py": """
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
""",
    "tests/test_wrap.py": """
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
""",
    "tests/test_measure.py": """
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
""",
}
