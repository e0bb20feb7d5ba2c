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
