"""The shape of the code a newcomer reads: no import cycle between solrl's modules (an import
inside a function counts) nor between its folders (a sub-package of solrl_core as one node), the
folders in layers that import only downwards (LAYERS), few modules loose at solrl_core's top, no
module over 450 lines, no function with more than 8 positional parameters (a Typer command's
parameters are its options, so the commands of solrl_cli/*_cmd.py are exempt), and the training
loop's iteration short enough to read on one screen."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("solrl", "solrl_core", "solrl_cli", "solrl_view")
MAX_LINES = 450
MAX_POSITIONAL = 8


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _named_import(node: ast.AST) -> str | None:
    """The module an `importlib.import_module("solrl...")` call names (an f-string: its constant head,
    e.g. f"solrl_core.rewards.{name}" names solrl_core.rewards at least); None for any other node."""
    if not (isinstance(node, ast.Call) and node.args and (
            isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            or isinstance(node.func, ast.Name) and node.func.id == "import_module")):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        text = str(arg.values[0].value).rstrip(".")
    else:
        return None
    return text if text.split(".")[0] in PACKAGES else None


def _imports(name: str, path: Path) -> set[str]:
    """The solrl modules `name` imports, anywhere in its file (an import_module string naming one too)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif (named := _named_import(node)) is not None:
            targets = [named]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert "solrl_core.loop.session" in graph["solrl_core.loop.trainer"]  # the graph sees real imports
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def _folder(name: str) -> str:
    """The node `name` belongs to at folder level: a sub-package of solrl_core or solrl_cli (its tui/)
    as a whole (with the packages inside it), any other module as itself."""
    parts = name.split(".")
    package = ".".join(parts[:2])
    if parts[0] in ("solrl_core", "solrl_cli") and len(parts) > 1 and MODULES.get(package, ROOT).name == "__init__.py":
        return package
    return name


def _folder_graph(graph: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """`graph` with each sub-package of solrl_core collapsed into one node, and for each edge left
    between two nodes the module imports that make it."""
    folders: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for name, targets in graph.items():
        here = folders.setdefault(_folder(name), set())
        for target in sorted(targets):
            if (there := _folder(target)) != _folder(name):
                here.add(there)
                why.setdefault((_folder(name), there), []).append(f"{name} imports {target}")
    return folders, why


def test_the_folder_graph_finds_a_cycle_the_module_graph_does_not():
    planted = {"solrl_core.faults.oom": {"solrl_core.loop.session"},
               "solrl_core.loop.session": {"solrl_core.faults.disk"},
               "solrl_core.faults.disk": set(), "solrl_core.errors": set()}
    assert _cycle(planted) is None
    folders, why = _folder_graph(planted)
    assert _cycle(folders) == ["solrl_core.faults", "solrl_core.loop", "solrl_core.faults"]
    assert why[("solrl_core.faults", "solrl_core.loop")] == ["solrl_core.faults.oom imports solrl_core.loop.session"]
    assert _folder("solrl_core.models.tinyworld.net") == "solrl_core.models"  # a package inside one is part of it
    assert _folder("solrl_core.errors") == "solrl_core.errors" and _folder("solrl_cli.app") == "solrl_cli.app"
    assert _folder("solrl_cli.tui.state") == "solrl_cli.tui"  # the CLI's rooms too: a module and a folder in a cycle


def test_the_folder_graph_finds_a_module_and_a_folder_importing_each_other():
    planted = {"solrl_cli.display": {"solrl_cli.tui.words"}, "solrl_cli.tui.words": set(),
               "solrl_cli.tui.app": {"solrl_cli.display"}}
    assert _cycle(planted) is None
    assert _cycle(_folder_graph(planted)[0]) == ["solrl_cli.display", "solrl_cli.tui", "solrl_cli.display"]


def test_no_import_cycle_between_folders():
    folders, why = _folder_graph({name: _imports(name, path) for name, path in MODULES.items()})
    assert "solrl_core.faults" in folders["solrl_core.loop"]  # the graph sees the folders
    cycle = _cycle(folders)
    assert cycle is None, " -> ".join(cycle) + ": " + "; ".join(
        "; ".join(why[(a, b)]) for a, b in zip(cycle, cycle[1:]))


# solrl_core's layers, lowest first: a folder (or a module at solrl_core's top) imports its own layer
# and the layers below it, never one above. docs/architecture.md draws the same order.
LAYERS = (
    ("errors", "text"),  # the error type and plain-text helpers
    ("faults",),  # what goes wrong where: full disks, links, locks, manifests, non-finite values
    ("events", "event_bus", "fault_text"),  # what the engine says, the bus and log that carry it, its warnings' words
    ("runtime", "telemetry"),  # the process: device, threads, TF32, torch.distributed, stops; FLOPs and MFU
    ("io",),  # files: the run folder, atomic writes, bounded JSON, pictures, clips
    ("data",),  # prompts and the tiny worlds
    ("precision",),  # the low-precision kernels and what each GPU runs
    ("rewards",),  # every reward, local or behind a URL
    ("config",),  # the typed config, presets, the checks of a run's inputs
    ("models",),  # the model loaders
    ("plan",),  # what a run does on this machine, decided once
    ("engine",),  # the model, its copies, the sampler, sharding, checkpoints
    ("tracking",),  # trackers and the reading of runs side by side
    ("loop",),  # the training loop, its stages, evaluations, calibration
    ("bench", "doctor"),  # side tools that run the core
    ("tools",),  # each command's one core function: start, evaluate, infer, explore, rank-check, export
)
LAYER_OF = {f"solrl_core.{unit}": depth for depth, units in enumerate(LAYERS) for unit in units}
# Above the core: what a run looks like in a terminal (solrl_view), then the command line and the Python API, thin
# siblings over tools/ that both print through it (solrl_core never imports any of them, nor the view the fronts).
VIEW = "solrl_view"
FRONTS = ("solrl_cli", "solrl")
LAYER_OF[VIEW] = len(LAYERS)
LAYER_OF.update({front: len(LAYERS) + 1 for front in FRONTS})
MAX_LOOSE = 8  # modules at solrl_core's top, beside its folders


def _layer(node: str) -> int | None:
    """The layer of a folder-graph node: a unit of solrl_core's, or the front package it lies in."""
    top = node.split(".")[0]
    return LAYER_OF.get(node, LAYER_OF.get(top) if top in (*FRONTS, VIEW) else None)


def _upward(folders: dict[str, set[str]], why: dict[tuple[str, str], list[str]]) -> list[str]:
    """Each import of a higher layer by a lower one, with the module imports that make it."""
    return [f"{a} -> {b} ({'; '.join(why[(a, b)])})" for a, targets in sorted(folders.items()) for b in sorted(targets)
            if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]


def test_every_folder_and_top_module_has_a_layer():
    units = {_folder(name) for name in MODULES if name.startswith("solrl_core.")}
    core = {unit for unit in LAYER_OF if unit.startswith("solrl_core.")}
    assert units == core, sorted(units ^ core)


def test_no_layer_imports_a_layer_above_it():
    folders, why = _folder_graph({name: _imports(name, path) for name, path in MODULES.items()})
    wrong = _upward(folders, why)
    assert not wrong, "a lower layer imports a higher one: " + ", ".join(wrong)


def test_the_layer_check_finds_a_planted_upward_import():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    graph["solrl_core.engine.sampler"] = graph["solrl_core.engine.sampler"] | {"solrl_core.loop.trainer"}
    folders, why = _folder_graph(graph)
    assert _upward(folders, why) == ["solrl_core.engine -> solrl_core.loop (solrl_core.engine.sampler imports "
                                     "solrl_core.loop.trainer)"]


def _planted(module: str, source: str) -> set[str]:
    """What `module` would import with `source` added to its file."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / MODULES[module].name
        path.write_text(MODULES[module].read_text(encoding="utf-8") + "\n" + source + "\n", encoding="utf-8")
        return _imports(module, path)


def test_the_layer_check_finds_a_planted_import_of_the_cli_or_the_api():
    """The core never imports the command line or the Python API: a planted `import solrl_cli` (or an
    import_module string naming one of their modules) in a core module fails the layer check."""
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    for source, target in (("import solrl_cli", "solrl_cli"), ("import solrl_cli.app", "solrl_cli.app"),
                           ("importlib.import_module('solrl.results')", "solrl.results"),
                           ("import_module(f'solrl_cli.tui.{name}')", "solrl_cli.tui")):
        planted = {**graph, "solrl_core.tools.start": _planted("solrl_core.tools.start", source)}
        assert target in planted["solrl_core.tools.start"], source
        folders, why = _folder_graph(planted)
        wrong = _upward(folders, why)
        assert len(wrong) == 1 and wrong[0].startswith(f"solrl_core.tools -> {_folder(target)} "), (source, wrong)


def test_few_modules_stand_loose_at_the_top():
    loose = sorted(name for name, path in MODULES.items() if name.count(".") == 1 and name.startswith("solrl_core.")
                   and path.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE, loose


def _line_length() -> int:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["line-length"]


def _long_lines(paths: list[Path], width: int, root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{i} ({len(line)})" for path in paths
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > width]


def test_no_line_is_longer_than_the_rule():
    """pyproject's [tool.ruff] line-length, over every Python file of the project (`ruff check` says the same)."""
    width = _line_length()
    assert width == 120
    folders = (*PACKAGES, "benchmarks", "scripts", "tests")
    long = _long_lines([p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))], width)
    assert not long, f"{len(long)} lines over {width} characters: " + ", ".join(long[:10])


def test_the_line_rule_finds_a_long_line(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("a = 1\nb = '" + "x" * 115 + "'\n", encoding="utf-8")  # line 2: 121 characters
    assert _long_lines([planted], 120, tmp_path) == ["x.py:2 (121)"]


def test_modules_stay_short():
    long = {name: n for name, path in sorted(MODULES.items())
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, "split by concern: " + ", ".join(f"{name} ({n} lines)" for name, n in long.items())


def _is_command(module: str, fn: ast.FunctionDef) -> bool:
    """A public function of a solrl_cli/*_cmd.py module: a command, registered in solrl_cli/app.py."""
    return module.startswith("solrl_cli.") and module.endswith("_cmd") and not fn.name.startswith("_")


def test_no_function_takes_more_than_8_positional_parameters():
    wide = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_command(name, node):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]  # self and cls count
                if len(params) > MAX_POSITIONAL:
                    wide.append(f"{name}.{node.name} ({len(params)})")
    assert not wide, "take the rest by name or as a value: " + ", ".join(wide)


def test_an_iteration_reads_on_one_screen():
    tree = ast.parse(MODULES["solrl_core.loop.trainer"].read_text(encoding="utf-8"))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_iteration"]
    assert fn.end_lineno - fn.lineno + 1 <= 30


def test_every_test_the_docs_cite_exists():
    """The README and docs/ name the tests behind their claims (the Reliability tables): each must exist."""
    import re

    root = Path(__file__).resolve().parents[1]
    cited = {name for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
             for name in re.findall(r"`(test_[a-z0-9_]+)`", doc.read_text())}
    defined = {name for test in (root / "tests").glob("test_*.py")
               for name in re.findall(r"^def (test_[a-z0-9_]+)", test.read_text(), re.M)}
    assert cited and not cited - defined, sorted(cited - defined)


def test_the_walk_from_the_loop_stays_at_or_below_the_loop():
    """benchmarks/code_walk.py follows run_iteration's calls: every file it enters is in the loop's
    layer or one below it (the loop calls down, never into a tool or a side tool)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_walk", ROOT / "benchmarks" / "code_walk.py")
    spec.loader.exec_module(code_walk := importlib.util.module_from_spec(spec))
    files, moves, back = code_walk.walk(ROOT, "solrl_core.loop.trainer")
    assert {"solrl_core/loop/stages.py",
            "solrl_core/loop/update.py"} <= set(files) and back == moves - (len(files) - 1) >= 0
    layers = {path: LAYER_OF.get(_folder(".".join(Path(path).with_suffix("").parts)), -1) for path in files}
    assert all(0 <= depth <= LAYER_OF["solrl_core.loop"] for depth in layers.values()), layers


def _test_modules_imported(source: str) -> set[str]:
    """The test modules (test_*.py) that `source` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{alias.name}" for alias in node.names] + [node.module or ""]
        else:
            continue
        found |= {name for name in names if name.split(".")[-1].startswith("test_")}
    return found


def test_the_test_import_check_finds_a_planted_import():
    planted = "def f():\n    from tests.test_tui import started\nimport tests.test_wan\nfrom tests import test_fsdp\n"
    assert _test_modules_imported(planted) == {"tests.test_tui", "tests.test_wan", "tests.test_fsdp"}
    assert not _test_modules_imported("from tests.helpers import started\nfrom tests.conftest import FAST\n")


def test_no_test_module_imports_another():
    """What tests share lives in tests/helpers.py (or conftest.py, serving.py): importing a test module
    runs its module-level code and, with pytest, can collect its tests twice."""
    found = {path.name: sorted(names) for path in sorted((ROOT / "tests").rglob("*.py"))
             if (names := _test_modules_imported(path.read_text(encoding="utf-8")))}
    assert not found, "move what they share to tests/helpers.py: " + str(found)
