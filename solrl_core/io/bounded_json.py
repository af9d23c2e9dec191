"""JSON from another process, read with bounds on its size before anything is built from it.

The standard library's json builds whatever a document holds: 57 MiB of `{},` becomes 19 million
dicts (1.5 GB), and a document nested 100,000 deep ends in RecursionError. `loads` first walks the
text without building anything, counting its tokens (strings, brackets, commas and colons: every
value of a container but the first follows a comma, so they bound the values) and the depth of its
brackets, and refuses a document past either bound; only then does json.loads build it. The walk
skips each string with the json module's own C string scanner (json.decoder.scanstring), so it ends
every string where json.loads does, and on a legitimate body of large base64 strings it costs about
as much as json.loads itself.

Why a walk and not a library: the standard library has no bound on elements, and a streaming
parser (ijson) would add a compiled dependency to the core install, which `remote:` and `vlm:`
clients need alone, for what these few lines over the json module's scanner do.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring
from typing import Any

_NEXT = re.compile(r'[\[\]{},:"]')


class JsonTooLarge(ValueError):
    """A document past a bound. `deep`: past the depth bound (else past the token bound)."""

    def __init__(self, message: str, deep: bool) -> None:
        super().__init__(message)
        self.deep = deep


def loads(raw: bytes | str, *, max_items: int, max_depth: int) -> Any:
    """json.loads(raw) for a document of at most `max_items` tokens nested at most `max_depth`
    deep; JsonTooLarge past either bound, before anything is built; ValueError when not JSON."""
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    check(text, max_items=max_items, max_depth=max_depth)
    return json.loads(text)


def check(text: str, *, max_items: int, max_depth: int) -> None:
    """JsonTooLarge when `text` holds more than `max_items` tokens or nests deeper than `max_depth`."""
    depth = items = pos = 0
    search = _NEXT.search
    while (found := search(text, pos)) is not None:
        items += 1
        if items > max_items:
            raise JsonTooLarge(f"holds more than {max_items} JSON values", deep=False)
        mark, pos = found.group(), found.end()
        if mark == '"':
            try:
                _, pos = scanstring(text, pos)
            except ValueError:  # not a JSON string: json.loads stops at the same place and says why
                return
        elif mark in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonTooLarge(f"is JSON nested deeper than {max_depth} levels", deep=True)
        elif mark in "]}":
            depth -= 1
