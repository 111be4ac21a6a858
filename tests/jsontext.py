"""Test helpers for JSON text."""


def outside_strings(text: str) -> str:
    """The characters of a JSON text that are not inside string literals."""
    out, in_str, escaped = [], False, False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        else:
            out.append(ch)
    return "".join(out)
