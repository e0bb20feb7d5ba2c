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
