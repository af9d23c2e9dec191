"""The one console class every command prints through: whatever string it is given (a run name, a
prompt, an event's message, a table cell) is shown without the terminal controls it may hold
(solrl_core.text.printable), since much of what commands print was read from a run folder, and a run
folder is data whoever wrote it: an escape sequence there must not clear the screen or retitle the window."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from solrl_core.text import has_control, printable


def _clean(obj: Any) -> Any:
    if isinstance(obj, Text) and has_control(obj.plain):  # rare: its spans go with the controls (rich dropped a BEL
        return Text(printable(obj.plain, lines=True), style=obj.style)  # already: an OSC's text may stay, harmless)
    return obj


class SafeConsole(Console):
    """rich's Console, with every string and Text printed made printable (newlines kept)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:  # every str rich renders: print's, a table cell's
        return super().render_str(printable(text, lines=True), **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        super().print(*(_clean(o) for o in objects), **kwargs)
