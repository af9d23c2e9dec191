"""Rewards from the user's own code: `mypkg.rewards:ocr`, `path/to/file.py:score`, or a name an
installed package declares in the `solrl.rewards` entry-point group (rewards/registry.py).

A plugin is either
- a callable `fn(images, prompts) -> Tensor[B]`: images float [B, 3, H, W] in [0, 1], one prompt
  per image, one score per image; or
- a class with the built-ins' interface (rewards/__init__.py): `__call__(images, prompts)` and
  optionally `check_prompts`, `summary`, `groups`. It is instantiated once per run, with the run's
  `RewardContext` (device, dtype, reward.paths.NAME, batch size) when `__init__` needs one argument,
  with none when it can be called without.

Everything that can be known without scoring is checked when the run's rewards are built, before
the model loads: the import (its exception named), the attribute, that it is callable with
(images, prompts) (inspect.signature). What it returns is checked on every call: a float tensor of
B scores, and on the first call not NaN or infinite for every image (scores that are non-finite for
some images are the fault guard's business: faults/guard.py drops those samples). A failure is a
`RewardFailure`, which the watchdog passes through unretried (watchdog.py).

A module path is imported with the current folder first on sys.path, as `python -m` does, so
`solrl train` and the processes of `--nproc-per-node` (started with `python -m solrl_cli`) find the
same module; a file is imported from its path, once per process.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.registry import entry_points, is_plugin_ref, split_ref
from solrl_core.rewards.watchdog import RewardFailure

DOCS = "see docs/rewards.md"


def _fail(name: str, what: str, fix: str) -> SolrlError:
    return SolrlError(f"reward plugin '{name}' {what}", fix)


def check_plugin(name: str) -> str:
    """Import the plugin `name` and check that it can be called as (images, prompts), without
    creating or calling it (`solrl doctor`); its fingerprint."""
    target = _resolve(name)
    _check_callable(name, target)
    return fingerprint(name, target)


def load_plugin(name: str, ctx: RewardContext | None = None) -> "PluginReward":
    """The plugin `name` names, imported, checked and (a class) instantiated for `ctx`."""
    target = _resolve(name)
    kind, fn = _check_callable(name, target)
    if kind == "class":
        try:
            fn = target(ctx or RewardContext()) if _takes_context(target) else target()
        except SolrlError:
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin's own code: named with its exception
            raise _fail(name, f"could not be created: {type(exc).__name__}: {exc}",
                        "fix its __init__ (SOLRL_DEBUG=1 shows the traceback); it takes no argument or a "
                        "RewardContext") from exc
    return PluginReward(name, fn, fingerprint(name, target))


def _resolve(name: str) -> Any:
    """The object a plugin name points at (imported)."""
    if is_plugin_ref(name):
        where, attr = split_ref(name)
        module = _import_file(name, where) if where.endswith(".py") else _import_module(name, where)
        if not hasattr(module, attr):
            public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise _fail(name, f"has no attribute '{attr}' in {where}",
                        f"name one of its callables: {', '.join(public[:8]) or 'it defines none'}")
        return getattr(module, attr)
    ep = entry_points().get(name)
    if ep is None:
        raise SolrlError(f"unknown reward '{name}'", "list them with: solrl presets")
    try:
        return ep.load()
    except AttributeError as exc:
        raise _fail(name, f"(entry point {ep.value}) names an attribute its module lacks: {exc}",
                    "fix the entry point in the package's pyproject.toml "
                    "([project.entry-points.\"solrl.rewards\"])") from exc
    except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's: named with its exception
        raise _fail(name, f"(entry point {ep.value}) failed to import: {type(exc).__name__}: {exc}",
                    "fix the import error (SOLRL_DEBUG=1 shows the traceback), or reinstall the package") from exc


def _import_module(name: str, module: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the plugin's: named with its exception
        fix = (f"install the package that holds {module}, or run solrl in the folder that holds it"
               if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name)
               else "fix the import error (SOLRL_DEBUG=1 shows the traceback)")
        raise _fail(name, f"failed to import: {type(exc).__name__}: {exc}", fix) from exc


def _import_file(name: str, path: str) -> Any:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise _fail(name, f"names {path}, which does not exist", "give a path to a .py file, relative to the folder "
                                                                 "you run solrl in")
    key = f"solrl_reward_plugin_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # before executing it, as an import does: dataclasses and pickle look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of the file is the plugin's: named with its exception
        del sys.modules[key]
        raise _fail(name, f"failed to import {path}: {type(exc).__name__}: {exc}",
                    "fix the error in that file (SOLRL_DEBUG=1 shows the traceback)") from exc
    return module


def _check_callable(name: str, target: Any) -> tuple[str, Any]:
    """('class', cls) or ('function', fn), when `target` can be called as (images, prompts)."""
    fix = ("a reward plugin is fn(images, prompts) -> Tensor[B], or a class whose __call__(self, images, prompts) does "
           "that; " + DOCS)
    if inspect.isclass(target):
        call = next((vars(k)["__call__"] for k in target.__mro__[:-1] if "__call__" in vars(k)), None)
        if call is None:
            raise _fail(name, f"is a class without __call__ ({target.__qualname__})", fix)
        if not _takes(target, 0) and not _takes(target, 1):
            raise _fail(name, f"is a class whose __init__{_signature(target)} needs more than one argument", "its "
                        "__init__ takes no argument or one RewardContext (device, dtype, path, batch_size); " + DOCS)
        if not _takes(call, 3):
            raise _fail(name,
                        f"is a class whose __call__{_signature(call)} cannot be called as (self, images, prompts)", fix)
        return "class", target
    if not callable(target):
        raise _fail(name, f"is not callable: it is a {type(target).__name__}", fix)
    if not _takes(target, 2):
        raise _fail(name, f"cannot be called as (images, prompts): its signature is {_signature(target)}", fix)
    return "function", target


def _signature(target: Any) -> str:
    try:
        return str(inspect.signature(target))
    except (TypeError, ValueError):
        return "(?)"


def _takes(target: Any, count: int) -> bool:
    """Whether `target` accepts `count` positional arguments (True when its signature is unknown)."""
    try:
        inspect.signature(target).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the first call tell
        return True
    return True


def _takes_context(cls: type) -> bool:
    """Whether a class is created with the RewardContext: when it cannot be created with no argument."""
    return not _takes(cls, 0)


def fingerprint(name: str, target: Any) -> str:
    """What a plugin resolved to: its qualified name and a hash of its module's source, so that
    processes of one run can tell whether they all hold the same code."""
    module = inspect.getmodule(target)
    source = getattr(module, "__file__", None) or ""
    digest = (hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source and Path(source).is_file()
              else "no-file")
    return f"{getattr(target, '__qualname__', type(target).__name__)} sha256:{digest}"


class PluginReward:
    """A plugin in the built-ins' shape: named, its output checked, its optional methods passed on."""

    def __init__(self, name: str, fn: Any, fingerprint: str) -> None:
        self.name, self.fn, self.fingerprint = name, fn, fingerprint
        self.calls = 0

    def __getattr__(self, attr: str) -> Any:  # check_prompts, summary, groups: only where the plugin has them
        if attr in ("fn", "name", "fingerprint", "calls") or attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.fn, attr)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        scores = self.fn(images, prompts)
        self.calls += 1
        return check_scores(self.name, scores, images.shape[0], first=self.calls == 1)

    def probe(self, prompts: list[str], size: int, device: torch.device) -> None:
        """One call on a probe batch (random images of the run's `size`, one per prompt), checked as every
        call is but for NaN (random images may fairly score NaN): a wrong shape or type, or an exception,
        is said before the model loads instead of after it and the first rollouts."""
        images = torch.rand(len(prompts), 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)
        probe = f"on a probe batch of {len(prompts)} random {size}x{size} images, before the model loads"
        try:
            scores = self.fn(images, prompts)
        except SolrlError:
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin's own code: named with its exception
            raise _fail(self.name, f"failed {probe}: {type(exc).__name__}: {exc}",
                        "fix the reward (SOLRL_DEBUG=1 shows the traceback), then run the same command again") from exc
        try:
            check_scores(self.name, scores, len(prompts), first=False)
        except RewardFailure as exc:
            raise SolrlError(f"{exc.message} ({probe})", exc.fix) from exc


def check_scores(name: str, scores: Any, batch: int, first: bool) -> torch.Tensor:
    """A plugin's scores as float32, or RewardFailure saying what is wrong with them."""
    fix = f"return a float tensor of shape [{batch}], one score per image; {DOCS}"
    if not isinstance(scores, torch.Tensor):
        raise RewardFailure(name, f"reward plugin '{name}' returned a {type(scores).__name__}, not a torch.Tensor", fix)
    if tuple(scores.shape) != (batch,):
        raise RewardFailure(name, f"reward plugin '{name}' returned shape {list(scores.shape)} for {batch} images, not "
                                  f"[{batch}]", fix)
    if not (scores.dtype.is_floating_point or scores.dtype in (torch.int32, torch.int64, torch.bool)):
        raise RewardFailure(name, f"reward plugin '{name}' returned a {scores.dtype} tensor, not a real number per "
                                  f"image", fix)
    scores = scores.detach().float()
    if first and batch and not bool(torch.isfinite(scores).any()):
        raise RewardFailure(name, f"reward plugin '{name}' returned NaN or infinity for every one of the {batch} "
                                  f"images of its "
                            "first batch", "check its input range (images are floats in [0, 1]) and its weights; a "
                            "score that is NaN for some images only is left out of training (faults/guard.py)")
    return scores
