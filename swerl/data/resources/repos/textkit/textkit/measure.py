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
