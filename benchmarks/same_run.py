"""Are two training runs the same run? Compares everything a run computes, to the last digit.

    python benchmarks/same_run.py RUN_A RUN_B

Compares, from each run folder's events.jsonl: every iteration's Stage-1 and Stage-2 reward
statistics, losses, gradient norm and old-adapter decay; every evaluation's mean, per-reward means,
extras and standard errors; every in-run rank check; and, bit for bit, every tensor of every
checkpoint (the LoRA, its old and EMA copies, the optimizer state). Timings, memory and the clock
are left out: they are measured, not computed. Prints each difference (the first 20) and exits 1 if
there is one, else prints what was compared and exits 0.

Used to show that a refactoring leaves the default run (`solrl train`) unchanged: run it once on
the old commit and once on the new, each with its own --run-dir, then compare the two folders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COMPUTED = {  # event -> the fields that are computed (not measured)
    "iteration": ("iteration", "draft", "final", "loss", "nonfinite_losses", "grad_norm", "old_decay"),
    "eval": ("iteration", "weights", "samples", "mean", "components", "extras", "delta_se"),
    "rank_check": ("iteration", "prompt", "seeds", "rho", "tau", "draft_mean", "full_mean"),
    "samples_dropped": ("iteration", "stage", "rewards", "dropped", "samples"),
    "step_skipped": ("iteration",),
}


def computed_events(run: Path) -> list[dict]:
    rows = []
    for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        fields = COMPUTED.get(event.get("event", ""))
        if fields is not None:
            rows.append({"event": event["event"], **{f: event.get(f) for f in fields}})
    return rows


def checkpoint_tensors(run: Path) -> dict[str, bytes]:
    """Every tensor of every checkpoint, as raw bytes keyed by checkpoint/file/name. Of the RNG
    states, torch's: the process-wide numpy and Python generators are seeded by each process from
    the OS and no draw of a run comes from them (every draw derives from (seed, iteration))."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted((run / "checkpoints").rglob("*.safetensors")):
        keep = _torch_rng_keys(path.with_suffix(".json")) if path.name == "rng.safetensors" else None
        for name, tensor in load_file(str(path)).items():
            if keep is not None and name not in keep:
                continue
            flat = tensor.contiguous().view(-1).view(dtype=_bytes_dtype())
            out[f"{path.relative_to(run)}:{name}"] = flat.numpy().tobytes()
    return out


def _torch_rng_keys(index: Path) -> set[str]:
    """The tensors of rng.safetensors that hold torch's generator states (rng.json says which)."""
    found: set[str] = set()

    def walk(node: object, under_torch: bool) -> None:
        if isinstance(node, dict):
            if under_torch and "__tensor__" in node:
                found.add(node["__tensor__"])
            for value in node.values():
                walk(value, under_torch)
        elif isinstance(node, list):
            if len(node) == 2 and isinstance(node[0], str):
                walk(node[1], under_torch or node[0] in ("torch", "cuda"))
            else:
                for value in node:
                    walk(value, under_torch)

    walk(json.loads(index.read_text(encoding="utf-8")), False)
    return found


def _bytes_dtype():  # noqa: ANN202 - torch.uint8, imported late (this script starts fast)
    import torch

    return torch.uint8


def differences(a: Path, b: Path) -> tuple[list[str], dict[str, int]]:
    found = []
    ea, eb = computed_events(a), computed_events(b)
    if len(ea) != len(eb):
        found.append(f"{len(ea)} computed events in {a}, {len(eb)} in {b}")
    for i, (x, y) in enumerate(zip(ea, eb)):
        if x != y:
            keys = [k for k in x if x.get(k) != y.get(k)]
            found.append(f"event {i} ({x['event']}, iteration {x.get('iteration')}): {', '.join(keys)} differ: "
                         f"{json.dumps({k: x.get(k) for k in keys})[:300]} vs "
                         f"{json.dumps({k: y.get(k) for k in keys})[:300]}")
    ta, tb = checkpoint_tensors(a), checkpoint_tensors(b)
    if set(ta) != set(tb):
        found.append(f"checkpoint tensors differ in name: {sorted(set(ta) ^ set(tb))[:5]}")
    found += [f"tensor {k} differs" for k in sorted(set(ta) & set(tb)) if ta[k] != tb[k]]
    counts = {kind: sum(e["event"] == kind for e in ea) for kind in COMPUTED}
    return found, {**{k: v for k, v in counts.items() if v}, "checkpoint tensors": len(ta)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    args = p.parse_args(argv)
    found, counts = differences(args.run_a, args.run_b)
    for line in found[:20]:
        print(line)
    if found:
        print(f"{len(found)} difference(s)")
        return 1
    print("identical: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + " (computed fields and bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
