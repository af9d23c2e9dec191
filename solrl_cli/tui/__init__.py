"""The terminal UI of a live or finished run (`solrl train --tui`, `solrl monitor`)."""

from __future__ import annotations

import os
import sys
from typing import Mapping, TextIO


def no_terminal(env: Mapping[str, str] = os.environ, stdin: TextIO | None = None,
                stdout: TextIO | None = None) -> str | None:
    """Whether the full-screen UI can run in this process: None when it can, else why not, in words
    ('' where nothing should be said). It needs a terminal for its screen (stdout) and for the keys
    that end it (stdin): without one (a pipe, nohup, CI) Textual would write escape codes and never
    exit. Under torchrun every process inherits the terminal, but only rank 0 hears the run's events:
    the others start no UI and stay silent (a word from them would land in rank 0's screen)."""
    if env.get("RANK", "0") != "0":
        return ""
    for name, stream in (("stdout", stdout or sys.stdout), ("stdin", stdin or sys.stdin)):
        if stream is None or not stream.isatty():
            return f"{name} is not a terminal"
    return None
