"""Errors become one line and a fix; the traceback only with SOLRL_DEBUG=1."""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator

import typer
from solrl_view.safe_console import SafeConsole as Console
from rich.text import Text

from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.text import printable

err_console = Console(stderr=True, highlight=False, markup=False)  # messages quote user text: no markup


def debug() -> bool:
    return os.environ.get("SOLRL_DEBUG", "") not in ("", "0")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except SolrlError as exc:
        _user_error(exc)
    except KeyboardInterrupt:
        err_console.print("stopped.")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - unexpected: say so plainly, keep the traceback one env var away
        if not debug() and (disk.disk_full(exc) or disk.read_only(exc) == errno.EROFS):  # where no caller expected it
            _user_error(disk.explain(exc, None, "a file") or SolrlError(str(exc)))
        if debug():
            raise
        err_console.print(Text.assemble(("internal error:", "bold red"), f" {type(exc).__name__}: "
                                                                         f"{printable(str(exc), lines=True)}"))
        err_console.print(Text.assemble("  ", ("fix:", "bold"), " rerun with SOLRL_DEBUG=1 for the traceback, and "
                                                                "report it"))
        raise typer.Exit(1) from None


def _user_error(exc: SolrlError) -> None:
    if debug():
        raise exc
    err_console.print(Text.assemble(("error:", "bold red"), f" {printable(exc.message, lines=True)}"), soft_wrap=True)
    if exc.fix:  # printable before rich's Text, which drops a BEL and would leave an OSC unterminated
        err_console.print(Text.assemble("  ", ("fix:", "bold"), f" {printable(exc.fix, lines=True)}"), soft_wrap=True)
    raise typer.Exit(2) from None
