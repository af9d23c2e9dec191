"""The walk a reader takes from the training loop: start at `run_iteration` and follow every call
that names a solrl function (a function of the same module, one imported by name from a solrl
module, or `module.function` through an imported solrl module), depth first, each function once.

    python benchmarks/code_walk.py [--root DIR] [--start MODULE:FUNCTION ...]

Prints the files the walk enters, its moves (calls into another file) and, of those, its moves back
(calls into a file the walk entered before: the reader returns to a file already read). Calls through objects
(`run.engine.generate(...)`) are not followed: a static reading
cannot tell their target, so the figures are a lower bound of what a reader meets. Used to compare
the code's layout before and after a change (run it on two checkouts).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGES = ("solrl_core", "solrl_cli", "solrl_view", "solrl")


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class Module:
    """A module's top-level functions and the solrl names it imports (function or module)."""

    def __init__(self, name: str, path: Path, known: dict[str, Path]) -> None:
        self.name, self.path = name, path
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (module, function)
        self.modules: dict[str, str] = {}  # local name -> module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in PACKAGES:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if f"{node.module}.{alias.name}" in known:
                        self.modules[local] = f"{node.module}.{alias.name}"
                    elif node.module in known:
                        self.names[local] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        self.modules[alias.asname] = alias.name

    def callees(self, fn: ast.AST) -> list[tuple[str, str]]:
        out = []
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name):
                if f.id in self.functions:
                    out.append((self.name, f.id))
                elif f.id in self.names:
                    out.append(self.names[f.id])
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.modules:
                out.append((self.modules[f.value.id], f.attr))
        return sorted(set(out), key=lambda c: (getattr(_line(fn, c[1]), "lineno", 0), c))


def _line(fn: ast.AST, name: str) -> ast.AST | None:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
            return node
    return None


def walk(root: Path, start_module: str, start: str = "run_iteration") -> tuple[list[str], int, int]:
    known = modules(root)
    loaded: dict[str, Module] = {}

    def module(name: str) -> Module:
        if name not in loaded:
            loaded[name] = Module(name, known[name], known)
        return loaded[name]

    seen: set[tuple[str, str]] = set()
    files: list[str] = []
    moves = back = 0

    def visit(mod: str, fn: str, stack: list[str]) -> None:
        nonlocal moves, back
        if (mod, fn) in seen or mod not in known or fn not in module(mod).functions:
            return
        seen.add((mod, fn))
        path = str(known[mod].relative_to(root))
        entered = set(files)
        if path not in files:
            files.append(path)
        if stack and stack[-1] != path:
            moves += 1
            back += path in entered
        for callee in module(mod).callees(module(mod).functions[fn]):
            visit(*callee, stack + [path])

    visit(start_module, start, [])
    return files, moves, back


# Where a reader starts: the training loop's iteration, and the front doors of a training run (the core
# function both doors call, then the CLI command above it)
STARTS = ("solrl_core.loop.trainer:run_iteration", "solrl_core.tools.start:start_run", "solrl_cli.train_cmd:train")


def main(argv: list[str] | None = None) -> list[tuple[str, int, int, int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--start", nargs="+", default=list(STARTS), metavar="MODULE:FUNCTION",
                        help=f"where each walk starts (default: {' '.join(STARTS)})")
    parser.add_argument("--files", action="store_true", help="list the files each walk enters")
    args = parser.parse_args(argv)
    known, out = modules(args.root), []
    print(f"root {args.root}")
    for start in args.start:
        module, _, function = start.partition(":")
        if module not in known:
            print(f"from {start}: no module {module} under {args.root}")
            continue
        files, moves, back = walk(args.root, module, function)
        out.append((start, len(files), moves, back))
        print(f"from {start}: {len(files)} files, {moves} moves, {back} back to a file read before")
        for path in files if args.files else []:
            print(f"  {path}")
    return out


if __name__ == "__main__":
    main()
