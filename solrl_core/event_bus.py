"""The event bus and the JSONL log: how events reach their subscribers and the run folder (the
event classes are in events.py, which re-exports these names)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

from solrl_core.faults import disk
from solrl_core.faults.links import open_nofollow

Subscriber = Callable[[Any], None]


class EventBus:
    """Fan-out of events to subscribers, in subscription order, one event at a time (the TUI's
    trainer thread and a signal handler in the main thread may both emit)."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._pending: list[Any] = []

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def unsubscribe(self, fn: Subscriber) -> None:
        self._subscribers.remove(fn)

    def emit(self, event: Any) -> None:
        with self._lock:
            self._deliver(event)
        self._flush()

    def emit_from_signal(self, event: Any) -> None:
        """Safe inside a signal handler: delivered now, or, when the handler interrupted a delivery
        (a subscriber half way through writing), right after that delivery ends."""
        self._pending.append(event)
        self._flush()

    def _flush(self) -> None:
        while self._pending and self._lock.acquire(blocking=False):
            try:
                while self._pending:
                    self._deliver(self._pending.pop(0))
            finally:
                self._lock.release()

    def _deliver(self, event: Any) -> None:
        for fn in self._subscribers:
            fn(event)


class JsonlLog:
    """Appends every event as one JSON line; flushed per event so a crash loses nothing written.

    A file whose last line a kill tore (no newline at its end) gets a newline first, so the next record
    starts a line of its own. A full or read-only disk is raised once, as the SolrlError of
    faults/disk.py; the log then writes nothing more, so the run's ending does not raise it again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.failed = False
        with self._writing():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_nofollow(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)  # a planted link gets nothing appended
            size = os.fstat(fd).st_size
            self._fh = os.fdopen(fd, "a", encoding="utf-8")
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":  # torn by a kill mid-write
                self._fh.write("\n")
                self._fh.flush()

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        return disk.writing(self.path.parent, self.path.name,
                            f"free space on that filesystem, then `solrl train --resume {self.path.parent}`")

    def __call__(self, event: Any) -> None:
        if self.failed:
            return
        try:
            with self._writing():
                self._fh.write(json.dumps(event.to_dict()) + "\n")
                self._fh.flush()
        except BaseException:
            self.failed = True
            raise

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:  # the buffer a full disk refused: already raised once
            if not self.failed:
                raise


class TooDeep(ValueError):
    """A JSONL line nested deeper than the JSON parser recurses: damaged, not a record solrl wrote."""


def parse_line(line: str | bytes) -> Any:
    """One line of events.jsonl as JSON. Every reader of the log parses through this, so a line nested
    10^6 deep is a ValueError (TooDeep) naming its line there, never a RecursionError."""
    try:
        return json.loads(line)
    except RecursionError:
        raise TooDeep("nested too deep to be a record solrl wrote") from None


class EventDecodeError(ValueError):
    """A record of a known kind whose fields do not fit that kind (a damaged or foreign file), or no
    event record at all. Readers stop and name the line: such a line is never dropped in silence."""

    def __init__(self, message: str, kind: object) -> None:
        super().__init__(message)
        self.kind = kind


class UnknownEventKind(EventDecodeError):
    """A record whose kind this version does not know: a newer solrl wrote it. Readers skip it and say so."""


def shown(value: Any) -> str:
    """repr(value) for a message: cut to 80 characters, a huge integer by its size (repr refuses past 4300 digits)."""
    return f"an integer of {value.bit_length()} bits" if isinstance(value,
            int) and value.bit_length() > 64 else repr(value)[:80]


# the JSON types each annotation (its text before any "[") accepts; bool is an int to Python, not here
JSON_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
                                            "dict": (dict,), "list": (list,)}
