"""The wheels to carry to a lent GPU machine, which reaches no network: pyproject's dependencies and
the `lease` extra, with everything they require, less what that machine has.

    python benchmarks/carry_list.py                       # the pip download command docs/gpu-lease.md shows
    python benchmarks/carry_list.py --baseline ../shared/gpu/BASELINE.md

No network: each requirement is resolved to the distribution installed here (its version is the one
the test suite passes with) and walked through its own Requires-Dist, markers evaluated for the
machine's CPython 3.12 on Linux x86_64. What the machine has: the packages its baseline names
("Its Python (3.12) has torch, ... and matplotlib"; the list below when the file is not at hand),
and what torch, transformers, peft and matplotlib require, walked here. typer and rich are taken as
they are, not walked: their requirements moved between releases (typer's newer ones need pydantic and
annotated-doc, which the machine lacked). A package the machine has is carried all the same when a
carried one needs a release newer than the minor before the one installed here (pydantic and anyio
need typing-extensions>=4.16): the machine's is older than that, as far as anything here can tell.
A requirement installed nowhere here is an error, with the fix.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT.parent / "shared" / "gpu" / "BASELINE.md"
MACHINE_HAS = ("torch", "transformers", "peft", "typer", "rich", "matplotlib")  # BASELINE.md of 2026-11-22
WALKED = ("torch", "transformers", "peft", "matplotlib")  # the machine's packages whose requirements it has too
LEASE_EXTRAS = ("lease",)
# the machine's CPython 3.12 on Linux x86_64, for environment markers
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "", "extra": ""}
DOWNLOAD = "pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d wheels"


def machine_has(baseline: Path | None) -> tuple[str, ...]:
    """The packages the GPU machine's Python has, from its baseline's sentence, else MACHINE_HAS."""
    if baseline is None or not baseline.exists():
        return MACHINE_HAS
    found = re.search(r"Its Python \([\d.]+\) has ([^.]+?)(?:,\s*but\b|\.)", " ".join(baseline.read_text().split()))
    if not found:
        sys.exit(f"{baseline}: no 'Its Python (3.x) has ...' sentence; pass --baseline a GPU baseline file")
    return tuple(canonicalize_name(n) for n in re.split(r",\s*|\s+and\s+", found.group(1).strip()) if n)


def requirements(name: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """`name`'s installed Requires-Dist that apply on the machine, with `extras` requested."""
    out = []
    for text in distribution(name).requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**MARKERS, "extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


def roots(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = LEASE_EXTRAS) -> list[Requirement]:
    """pyproject's dependencies and `extras`' (a `solrl[x]` inside an extra expanded)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found, todo = list(map(Requirement, project["dependencies"])), list(extras)
    while todo:
        for req in map(Requirement, project["optional-dependencies"][todo.pop()]):
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo.extend(req.extras)
            else:
                found.append(req)
    return found


def _installed(name: str) -> Version:
    try:
        return Version(distribution(name).version)
    except PackageNotFoundError:
        sys.exit(f"{name} is required but not installed here, so its requirements cannot be walked: "
                 "pip install -e '.[lease]' first")


def provided(has: tuple[str, ...]) -> set[str]:
    """What the machine has: its packages, and what WALKED of them require (walked here)."""
    seen, todo = set(), [n for n in has if n in WALKED]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        if name in has and name not in WALKED:
            continue  # typer, rich: as they are
        try:
            todo += [r.name for r in requirements(name)]
        except PackageNotFoundError:
            continue  # a requirement of the machine's packages not installed here: the machine's own business
    return seen | set(has)


def _too_new(req: Requirement) -> bool:
    """Whether `req` excludes the minor release before the installed one (e.g. typing-extensions>=4.16)."""
    v = _installed(req.name)
    if not req.specifier or v.major == v.minor == 0:
        return False
    older = Version(f"{v.major}.{v.minor - 1}.99") if v.minor else Version(f"{v.major - 1}.99")
    return not req.specifier.contains(older, prereleases=True)


def carry_list(has: tuple[str, ...] = MACHINE_HAS, start: list[Requirement] | None = None) -> dict[str, str]:
    """name -> installed version of every distribution to carry."""
    has = tuple(canonicalize_name(n) for n in has)
    there = provided(has)
    carry: dict[str, str] = {}
    todo = [(r, ()) for r in (roots() if start is None else start) if r.marker is None or r.marker.evaluate(MARKERS)]
    walked: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        req, _ = todo.pop()
        name = canonicalize_name(req.name)
        if name in has:
            continue  # the machine has it: its own requirements are its business
        if name not in there or _too_new(req):
            carry[name] = str(_installed(name))
        key = (name, tuple(sorted(req.extras)))
        if key in walked:
            continue
        walked.add(key)
        _installed(name)
        # a package carried: all its requirements; one the machine has: those of the extras asked of it
        if name in carry:
            todo += [(r, ()) for r in requirements(name, tuple(req.extras))]
        elif req.extras:
            base = {str(r) for r in requirements(name)}
            todo += [(r, ()) for r in requirements(name, tuple(req.extras)) if str(r) not in base]
    return dict(sorted(carry.items()))


def command(carry: dict[str, str]) -> str:
    """The pip download command, a few pins a line."""
    pins = [f"{name}=={version}" for name, version in carry.items()]
    lines = [" ".join(pins[i:i + 5]) for i in range(0, len(pins), 5)]
    return DOWNLOAD + " \\\n  " + " \\\n  ".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, default=BASELINE, help=f"the GPU machine's baseline (default: {BASELINE}, "
                   f"else the packages it named: {', '.join(MACHINE_HAS)})")
    args = p.parse_args(argv)
    has = machine_has(args.baseline)
    print(f"# the machine has: {', '.join(has)} "
          f"({args.baseline if args.baseline.exists() else 'carry_list.MACHINE_HAS'})")
    print(command(carry_list(has)))


if __name__ == "__main__":
    main()
