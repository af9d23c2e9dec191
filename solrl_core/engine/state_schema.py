"""Every value a checkpoint holds, checked against what solrl writes before any of it is used.

A checkpoint's files are data from whoever wrote the run folder, and its manifest is no defence
against that writer (they rewrite it to match). So, before the loop runs:

- trainer_state.json: each counter an integer in its range (the iteration the checkpoint's own
  number, the steps and streaks at most that many), one finite reward per iteration, finite seconds,
  each evaluation's verdict an iteration up to it with two finite numbers and a list of names;
- the optimizer state: its groups and parameters those of the optimizer it loads into, each moment
  a tensor of its parameter's dtype and shape, each step count one finite number >= 0;
- the RNG states: the sizes the generators use (a numpy array's dtype is checked where it is
  decoded, before it is allocated: faults/state_files.py);
- and no file of the checkpoint larger than its adapters could make it (a sparse file claiming
  gigabytes is refused before it is read).

A value out of its schema is one SolrlError naming the file and the field (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from solrl_core.config.choices import EXPLORE_PRECISIONS
from solrl_core.errors import SolrlError

TRAINER_STATE = "trainer_state.json"
FIX = "resume from an earlier checkpoint with `--checkpoint iter_N`, or start the run again"
_NUMBER = re.compile(r"^iter_(\d+)$")
MAX_STEPS = 10_000  # Stage 1's preview steps: far above any sampler's (calibration.py chooses <= sampler.steps)
_MOMENTS = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}  # AdamW's per-parameter tensors beside "step"
BOUND = 1e6  # a stored reward, gain or standard error: rewards are scores of order 1, never near this
_VERDICT = {"iteration", "gain", "se", "flagged"}  # an evaluation's verdict (loop/hacking.py)
SLACK = 64 << 20  # bytes any checkpoint file may hold beyond what its adapters need (trainer_state's history)


class _Said(str):
    """A description shown as it is (not quoted like a value read from the file)."""

    def __repr__(self) -> str:
        return str(self)


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        return f"an integer of {len(str(abs(value)))} digits"  # not the digits themselves: one line
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(value: Any, bound: float = BOUND, low: float | None = None) -> bool:
    """A JSON number (not a bool) within +-`bound` (and >= `low`): finite, and never an integer too large
    for a float (math.isfinite and float() raise OverflowError on 10**4000)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if isinstance(value, int) and value.bit_length() > 64:
        return False
    return math.isfinite(value) and abs(value) <= bound and (low is None or value >= low)


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _bad(path: Path, field: str, value: Any, expected: str) -> SolrlError:
    return SolrlError(f"{path} is not a state solrl wrote: {field} is {_show(value)}, {expected} expected", FIX)


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json, every value checked (see the module docstring)."""
    path = checkpoint / TRAINER_STATE
    if path.stat().st_size > SLACK:
        raise SolrlError(f"{path} holds {path.stat().st_size} bytes, more than a run's state ({SLACK >> 20} MiB)", FIX)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SolrlError(f"{path} is not JSON ({type(exc).__name__})", FIX) from None
    if not isinstance(saved, dict):
        raise SolrlError(f"{path} is not a JSON object", FIX)
    number = _NUMBER.match(checkpoint.name)
    it = saved.get("iteration")
    if number is not None and it != int(number.group(1)) or not _int(it, 0, 10**9):
        raise _bad(path, '"iteration"', it,
                   f"the checkpoint's own number ({int(number.group(1))})" if number else "0 ... 10^9")
    _check(path, '"step"', saved.get("step"), lambda v: _int(v, 0, it), f"an integer 0 ... {it}")
    history = saved.get("history")
    _check(path, '"history"', history, lambda v: isinstance(v, list) and len(v) == it, f"a list of {it} rewards")
    for i, reward in enumerate(history):
        _check(path, f'"history"[{i}]', reward, lambda v: isinstance(v, float) and not math.isfinite(v) or _finite(v),
               f"a number within +-{BOUND:g} (or NaN)")  # NaN: no finite reward that iteration
    _check(path, '"seconds"', saved.get("seconds", 0.0), lambda v: _finite(v, 10.0**12, 0), "a finite number >= 0")
    faults = saved.get("faults") or {}
    _check(path, '"faults"', faults, lambda v: isinstance(v, dict), "an object")
    for field, streaks in (('"reward_streaks"', saved.get("reward_streaks", {})),
                           ('"faults"."nonfinite_rewards"', faults.get("nonfinite_rewards", {}))):
        _check(path, field, streaks, lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and _int(n, 0, it) for k, n in v.items()), f"reward names with counts 0 ... {it}")
    _check(path, '"faults"."skipped_steps"', faults.get("skipped_steps", 0), lambda v: _int(v, 0, it), f"an integer 0 "
                                                                                                       f"... {it}")
    _check(path, '"explore_steps"', saved.get("explore_steps", 1), lambda v: _int(v, 1, MAX_STEPS), f"an integer 1 ... "
                                                                                                    f"{MAX_STEPS}")
    _check(path, '"rollbacks"', saved.get("rollbacks", 0), lambda v: _int(v, 0, 1000), "an integer 0 ... 1000")
    evaluations = saved.get("evaluations", [])
    _check(path, '"evaluations"', evaluations, lambda v: isinstance(v, list) and len(v) <= it + 1, f"a list of at most "
                                                                                                   f"{it + 1}")
    for i, e in enumerate(evaluations):
        _check(path, f'"evaluations"[{i}]', e,
               lambda v: isinstance(v, dict) and set(v) - {"changes"} == _VERDICT and _int(v["iteration"], 0, it)
               and _finite(v["gain"]) and _finite(v["se"], low=0)
               and isinstance(v["flagged"], list) and all(isinstance(n, str) for n in v["flagged"])
               and _changes_ok(v.get("changes", {})),
               f"an object of {', '.join(sorted(_VERDICT))} (an iteration 0 ... {it}, a gain and an s.e. within "
               f"+-{BOUND:g}, "
               "a list of names, optional changes: names with numbers within the same bound)")
    precisions = [p for p in EXPLORE_PRECISIONS if p != "auto"]
    _check(path, '"explore_precision"', saved.get("explore_precision", precisions[0]), lambda v: v in precisions,
           "one of " + ", ".join(precisions))
    return saved


def _changes_ok(changes: Any) -> bool:
    """A verdict's "changes": eval reward names with finite numbers (frontier.py reads them)."""
    return isinstance(changes, dict) and all(isinstance(k, str) and _finite(x) for k, x in changes.items())


def _check(path: Path, field: str, value: Any, ok: Any, expected: str) -> None:
    if not ok(value):
        raise _bad(path, field, value, expected)


def check_sizes(checkpoint: Path, parameters: list[torch.Tensor]) -> None:
    """Refuse a checkpoint file larger than its adapters make any (the largest, the optimizer's two
    float32 moments of every adapter parameter, plus SLACK), before anything is read from it."""
    limit = 2 * 4 * sum(p.numel() for p in parameters) + SLACK
    for folder, _, files in os.walk(checkpoint):
        for name in files:
            path = Path(folder) / name
            size = path.stat().st_size
            if size > limit:
                raise SolrlError(f"{path} holds {size} bytes, more than this model's adapters and their optimizer "
                                 f"state could ({limit}): solrl does not read it", FIX)


def check_optimizer(checkpoint: Path, saved: Any, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer state `saved` fits `optimizer`: the same groups of the same parameters, each
    moment of its parameter's shape, each hyperparameter of the kind the optimizer holds."""
    where = checkpoint / "optimizer.json"
    fresh = optimizer.state_dict()["param_groups"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict)
            and isinstance(saved.get("param_groups"), list)):
        raise _bad(where, "the state", _Said(f"a {type(saved).__name__}"), '{"state", "param_groups"}')
    groups = saved["param_groups"]
    _check(where, '"param_groups"', len(groups), lambda n: n == len(fresh), f"{len(fresh)} groups")
    for i, (group, mine) in enumerate(zip(groups, fresh)):
        _check(where, f'"param_groups"[{i}]', _Said(f"a {type(group).__name__}"), lambda _: isinstance(group, dict),
               "an object")
        _check(where, f'"param_groups"[{i}]."params"', group.get("params"), lambda v: v == mine["params"],
               str(mine["params"]))
        for key, value in group.items():
            if key != "params" and key in mine and not _same_kind(value, mine[key]):
                raise _bad(where, f'"param_groups"[{i}].{key}', value, f"a value like {mine[key]!r}")
    for index, entry in saved["state"].items():
        _check(where, '"state" key', index, lambda v: _int(v, 0, len(params) - 1), f"a parameter index 0 ... "
                                                                                   f"{len(params) - 1}")
        _check(where, f'"state"[{index}]', _Said(f"a {type(entry).__name__}"), lambda _: isinstance(entry, dict),
               "an object")
        shape, dtype = tuple(params[index].shape), params[index].dtype
        for key, value in entry.items():
            if key == "step":
                ok = (torch.is_tensor(value) and value.numel() == 1 and bool(torch.isfinite(value).all())
                      and float(value) >= 0)
                _check(where, f'"state"[{index}].step', _tensor(value), lambda _: ok, "one finite number >= 0")
            else:
                ok = (key in _MOMENTS and torch.is_tensor(value) and value.dtype == dtype and tuple(value.shape)
                      == shape)
                _check(where, f'"state"[{index}].{key}', _tensor(value), lambda _: ok, f"a {dtype} tensor of shape "
                                                                                       f"{list(shape)}")


def _tensor(value: Any) -> Any:
    return _Said(f"a {value.dtype} tensor of shape {list(value.shape)}") if torch.is_tensor(value) else value


def _same_kind(value: Any, mine: Any) -> bool:
    """A saved hyperparameter of the kind the fresh optimizer holds there (finite and >= 0, where a number)."""
    if mine is None or isinstance(mine, bool):  # foreach, fused, amsgrad, maximize ...
        return value is None or isinstance(value, bool)
    if isinstance(mine, (int, float)):  # lr, eps, weight_decay
        return _finite(value, 10.0**12, 0)
    if isinstance(mine, (tuple, list)):  # betas
        return isinstance(value, (tuple, list)) and len(value) == len(mine) and all(_same_kind(v, m)
                                                                                    for v, m in zip(value, mine))
    return isinstance(value, type(mine))


def check_rng(checkpoint: Path, rng: Any) -> None:
    """The RNG states have the sizes the generators use (numpy's MT19937 key: 624 words)."""
    where = checkpoint / "rng.json"
    _check(where, "the state", _Said(f"a {type(rng).__name__}"),
           lambda _: isinstance(rng, dict) and {"torch", "numpy", "python", "cuda"} <= set(rng),
           'an object of "torch", "numpy", "python", "cuda"')
    size = torch.get_rng_state().numel()
    torch_state = rng["torch"]
    _check(where, '"torch"', _tensor(torch_state),
           lambda _: torch.is_tensor(torch_state) and torch_state.dtype == torch.uint8
           and torch_state.numel() == size, f"a uint8 tensor of {size}")
    numpy_state = rng["numpy"]
    _check(where, '"numpy"', _Said(f"a {type(numpy_state).__name__}"),
           lambda v: isinstance(numpy_state, (tuple, list)) and len(numpy_state) == 5
           and numpy_state[0] == "MT19937" and isinstance(numpy_state[1], np.ndarray) and numpy_state[1].shape
           == (624,),
           "numpy's MT19937 state (a key of 624 words)")
    python_state = rng["python"]
    _check(where, '"python"', _Said(f"a {type(python_state).__name__}"),
           lambda v: isinstance(python_state, (tuple, list))
           and len(python_state) == 3 and isinstance(python_state[1], (tuple, list)) and len(python_state[1]) == 625,
           "Python's random state (625 words)")
    cuda = rng["cuda"]
    _check(where, '"cuda"', _Said(f"a {type(cuda).__name__}"), lambda v: isinstance(cuda, list) and all(
        torch.is_tensor(t) and t.dtype == torch.uint8 and t.numel() <= 1 << 16 for t in cuda),
           "a list of uint8 tensors")
