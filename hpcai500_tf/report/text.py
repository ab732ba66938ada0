"""Text from records, logs and paths made safe to show: records are user input."""

from __future__ import annotations


def printable(value) -> str:
    """`value` as text a terminal or page shows as it is: control characters (ESC sequences,
    carriage returns, bells) and unpaired surrogates written as Python escapes (`\\x1b`,
    `\\ud800`); line breaks and tabs kept."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() or char in "\n\t" else _escaped(char) for char in text
    )


def _escaped(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )
