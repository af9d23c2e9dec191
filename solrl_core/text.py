"""Small helpers for text shown to people (torch-free: the CLI and the config errors use them)."""

from __future__ import annotations

import re
from typing import Any


def plural(n: int, one: str, many: str = "") -> str:
    """'1 iteration', '3 iterations' (`many` for irregular plurals: plural(2, 'loss', 'losses'))."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


# What a terminal acts on rather than shows: escape sequences (CSI `ESC [ ... final`, OSC `ESC ] ... BEL or
# ESC \`, DCS/APC/PM/SOS up to ESC \, and two-character ones), their 8-bit forms (C1: U+0080-U+009F),
# the other C0 controls (BEL, backspace, carriage return, ...) and DEL.
# An OSC (or DCS...) string goes to its terminator; one without (a BEL already dropped) loses only its
# introducer, so the text after it stays readable.
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
                       r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"  # OSC, DCS, SOS, PM, APC, terminated
                       # their 8-bit forms
                       r"|\x9b[0-?]*[ -/]*[@-~]?|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x9c)"
                       r"|\x1b[ -~]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every terminal control sequence and control character removed (tab kept; a newline
    kept with `lines`, else a space): what any command prints of a string that came from a run folder
    (events, state, config, a foreign file's name), so such a string cannot clear the screen, set the
    window title or rewrite what was printed before it."""
    if text.isprintable():
        return text
    text = _CONTROL.sub("", _SEQUENCE.sub("", text.replace("\r\n", "\n")))  # \n and \t are outside _CONTROL
    return text if lines else text.replace("\n", " ")


def has_control(text: str) -> bool:
    """Whether `printable` would change `text` (newlines allowed)."""
    return printable(text, lines=True) != text


def printable_data(value: Any) -> Any:
    """`value` (decoded JSON) with every string in it, dict keys too, made `printable` (newlines kept);
    an integer beyond a float's range raises OverflowError here, once, not wherever it is next used."""
    if isinstance(value, str):
        return printable(value, lines=True)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_data(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**1023:
        raise OverflowError(f"an integer of {value.bit_length()} bits, beyond a float")
    return value
