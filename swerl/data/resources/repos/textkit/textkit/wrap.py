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
