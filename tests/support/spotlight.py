"""Reading quotes back out of a prompt, to check their bounds and datamarks."""

from __future__ import annotations

from poirotd.protocol.spotlight import CLOSE, MARK, OPEN, Spotlight


def split_quotes(text: str, spotlight: Spotlight) -> tuple[list[str], list[list[str]]]:
    """The lines of `text` outside quotes, and each quote's lines; fails unless every quote
    opens and closes with `spotlight`'s bounds, on lines of their own, and every line inside is
    datamarked. A bound character outside a bound line is a failure too (it was not defused)."""
    outside: list[str] = []
    quotes: list[list[str]] = []
    inside: list[str] | None = None
    for line in text.split("\n"):
        if line == spotlight.opening:
            assert inside is None, f"a quote opened inside a quote: {text!r}"
            inside = []
        elif line == spotlight.closing:
            assert inside is not None, f"a quote closed that was not open: {text!r}"
            quotes.append(inside)
            inside = None
        elif inside is not None:
            assert line == MARK or line.startswith(MARK + " "), f"unmarked quoted line {line!r}"
            assert OPEN not in line and CLOSE not in line, f"bound characters in {line!r}"
            inside.append(line)
        else:
            outside.append(line)
    assert inside is None, f"a quote left open: {text!r}"
    return outside, quotes
