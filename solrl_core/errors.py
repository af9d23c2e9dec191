"""One error type for everything a user can fix: a message and the fix, printed as two short lines."""

from __future__ import annotations


class SolrlError(Exception):
    """A problem the user can act on. `fix` says what to do about it. `resumable` False: continuing the
    run (`--resume`) would not help (its checkpoints hold what failed), so a run's last line offers no resume."""

    def __init__(self, message: str, fix: str = "", *, resumable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.resumable = resumable

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


def close_matches(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """'did you mean ...' text for an unknown name, or a list of the valid ones."""
    import difflib

    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.5)
    if near:
        return "did you mean " + " or ".join(repr(n) for n in near) + "?"
    return "choose one of: " + ", ".join(sorted(choices))
