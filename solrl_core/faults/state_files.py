"""State a checkpoint keeps besides the adapters, stored so that reading it can never run code.

A run folder can come from someone else: a shared filesystem, a downloaded run, a colleague's
checkpoint. A pickle (`torch.save`) executes whatever its author planted when it is loaded, so the
optimizer and RNG states are written as two plain files instead: every tensor in a safetensors file
(`NAME.safetensors`) and the structure around them, with the numbers that are not tensors, in JSON
(`NAME.json`). Reading them parses data and nothing else.

Checkpoints written before this format hold `optimizer.pt` and `rng.pt`. They are still read, but only
through torch's restricted unpickler (`weights_only=True`) with numpy's array reconstruction as the
one extra allowed global (numpy's RNG state is an array): a pickle that asks for anything else is
refused with a clear error, never run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save

from solrl_core.errors import SolrlError

_TENSOR, _ARRAY, _TUPLE, _ITEMS = "__tensor__", "__ndarray__", "__tuple__", "__items__"


def save_state(obj: Any, folder: Path, name: str) -> None:
    """`obj` (dicts, lists, tuples, numbers, strings, None, tensors, numpy arrays) into
    `folder/NAME.safetensors` and `folder/NAME.json`."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(obj, tensors)
    with open(folder / f"{name}.safetensors", "wb") as fh:  # an open file: a full disk surfaces as ENOSPC
        fh.write(save(tensors))
    with open(folder / f"{name}.json", "w", encoding="utf-8") as fh:
        json.dump(skeleton, fh)


def load_state(folder: Path, name: str) -> Any:
    """What `save_state` wrote; a malformed file is a SolrlError naming it."""
    try:
        tensors = load_file(str(folder / f"{name}.safetensors"))
        skeleton = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        return _decode(skeleton, tensors)
    except SolrlError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to parse means the file cannot be trusted
        raise SolrlError(f"{folder / name}.json/.safetensors is unreadable or corrupt: {type(exc).__name__}: {exc}",
                         "resume from an earlier checkpoint with `--checkpoint iter_N`") from exc


def has_state(folder: Path, name: str) -> bool:
    return (folder / f"{name}.json").is_file()


def load_legacy(path: Path) -> Any:
    """A `.pt` file of the old format, through torch's restricted unpickler: tensors, containers,
    numbers, and numpy arrays (the one extra allowed global). Anything else is refused, not run."""
    allowed = [np.ndarray, np.dtype, np.dtypes.UInt32DType, _reconstruct()]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an UnpicklingError here is a planted or foreign pickle
        raise SolrlError(f"{path} is not a plain checkpoint state file: solrl refuses to load it, since loading an "
                         f"arbitrary pickle can run code ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
                         "if you trust the folder's author, resume from a checkpoint solrl wrote itself "
                         "(`--checkpoint iter_N`), or start the run again") from exc


def _reconstruct() -> Any:
    try:
        from numpy._core.multiarray import _reconstruct as fn  # numpy 2
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core.multiarray import _reconstruct as fn  # type: ignore[no-redef]
    return fn


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if torch.is_tensor(obj):
        key = str(len(tensors))
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {_TENSOR: key}
    if isinstance(obj, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).astype(np.int64 if obj.dtype.kind in "ui"
                                                                         else obj.dtype))
        return {_ARRAY: key, "dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {_ITEMS: [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint state file")


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise ValueError(f"unexpected {type(node).__name__}")
    if _TENSOR in node:
        return tensors[node[_TENSOR]]
    if _ARRAY in node:  # a numeric dtype only: "<U400000" would allocate 1.6 MB per element before any check
        dtype = np.dtype(str(node["dtype"]))
        if dtype.kind not in "biuf":
            raise ValueError(f"an array of dtype {str(node['dtype'])[:20]!r}: only numbers are stored")
        return tensors[node[_ARRAY]].numpy().astype(dtype)
    if _TUPLE in node:
        return tuple(_decode(v, tensors) for v in node[_TUPLE])
    if _ITEMS in node:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in node[_ITEMS]}
    raise ValueError(f"unexpected keys {sorted(node)[:4]}")
