"""The one command a lent GPU runs first: the self-test, `pytest -m gpu`, then the GPU measurements in
order of value, each under its own time budget, within the lease's.

    python benchmarks/lease.py                          # on the lent GPU (--out defaults to $OUT, else ./lease-out)
    python benchmarks/lease.py --size tiny --device cpu # the same steps at tiny size: CI runs it, so a lease meets no typo

Each step is a subprocess with its own time limit (the smaller of its budget and what is left of
--budget); its output goes to OUT/<step>.log and its figures to OUT/<step>.json, and OUT/lease.json is
rewritten after every step (command, exit code, seconds, timed out or not), so a lease cut off still
returns everything measured so far. A step that fails does not stop the next. The steps (the GPU
issue, docs/gpu-lease.md): the self-test on the device; `pytest -m gpu`; FLUX.1 `sol_rl` against
`compile` at the same N and K, the published VAE, a reward network of the real size, compile mode
`default`; SANA both families with TF32 on; the explore step per backend; a Wan 2.1 1.3B iteration.
At tiny size the self-test runs a few rows and the families skip `compile` (a CPU compile costs about
a minute a copy); the commands are otherwise the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOLRL = [sys.executable, "-m", "solrl_cli"]
TINY_SELFTEST = "model/sana,reward-server"  # the whole self-test runs once in CI, in tests/test_selftest.py
MIN_STEP_S = 20  # a step is not started with less than this left of the lease's budget


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    budget_s: int
    writes: list[str] = field(default_factory=list)  # the JSON files it writes under OUT


def steps(size: str, device: str, out: Path, big_gpu: bool) -> list[Step]:
    """The lease's steps in order of value. `big_gpu`: an H200-class memory (the official N=96, K=24 for FLUX.1)."""
    tiny = size == "tiny"
    at = ["--size", size, "--device", device]
    few = ["--n", "4", "--k", "2", "--rollout-batch", "4", "--iterations", "2"] if tiny else []
    both = ["--family", "sol_rl"] + ([] if tiny else ["--family", "compile"])
    flux_nk = [] if tiny else (["--n", "96", "--k", "24"] if big_gpu else ["--n", "24", "--k", "12", "--rollout-batch", "12"])
    return [
        Step("selftest", [*SOLRL, "doctor", "--selftest", "--device", device, "--json-out", str(out / "selftest.json"),
                          *(["--only", TINY_SELFTEST] if tiny else [])], 180, ["selftest.json"]),
        Step("pytest_gpu", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
                            *(["tests/test_nvfp4.py"] if tiny else ["tests"])], 120),
        Step("flux1", [*SOLRL, "bench", "--model", "flux1", *at, *both, *flux_nk, *few, "--real-vae", "--reward-model",
                       "pickscore", "--compile-mode", "default", *([] if tiny else ["--iterations", "3"]),
                       "--json", str(out / "flux1.json")], 240, ["flux1.json"]),
        Step("sana", [*SOLRL, "bench", "--model", "sana", *at, *both, *few, "--set", "run.tf32=true",
                      *([] if tiny else ["--iterations", "4"]), "--json", str(out / "sana.json")], 180, ["sana.json"]),
        Step("explore_step", [sys.executable, str(ROOT / "benchmarks" / "explore_step.py"), "--models", "sana", *at,
                              *(["--backends", "bf16", "nvfp4-emulated", "--batch", "2", "--warmup", "1", "--repeats", "1"]
                                if tiny else []),
                              "--json", str(out / "explore_step.json")], 90, ["explore_step.json"]),
        Step("wan", [*SOLRL, "bench", "--model", "wan21_t2v_1_3b", *at, "--family", "sol_rl", *few,
                     *([] if tiny else ["--iterations", "2"]), "--json", str(out / "wan.json")], 150, ["wan.json"]),
    ]


def at_size(chosen: list[Step], size: str) -> list[Step]:
    """At tiny size on a (shared, loaded) CPU the budgets are the GPU's no longer: each step gets 600 s."""
    return chosen if size == "real" else [Step(s.name, s.command, 600, s.writes) for s in chosen]


def run_step(step: Step, out: Path, left_s: float) -> dict:
    """Run one step under min(its budget, what is left); its output into OUT/<name>.log."""
    limit = min(step.budget_s, int(left_s))
    start = time.monotonic()
    log = out / f"{step.name}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(step.command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # its own session: the step's children (torchrun's workers) go with it
            rc, timed_out = proc.wait(), True
    return {**asdict(step), "limit_s": limit, "rc": rc, "timed_out": timed_out, "seconds": time.monotonic() - start,
            "log": log.name, "written": [w for w in step.writes if (out / w).exists()]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="real", choices=("real", "tiny"), help="real: published sizes (a GPU); tiny: any machine")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "lease-out"), help="output folder ($OUT if set)")
    p.add_argument("--budget", type=int, default=540, help="seconds for all steps together (default 540: 9 minutes)")
    p.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    big = _gpu_memory_gib() >= 120
    chosen = [s for s in at_size(steps(args.size, args.device, args.out.resolve(), big), args.size)
              if not args.only or s.name in args.only]
    deadline = time.monotonic() + args.budget
    report: dict = {"size": args.size, "device": args.device, "budget_s": args.budget, "commit": _commit(), "steps": []}
    for step in chosen:
        left = deadline - time.monotonic()
        if left < MIN_STEP_S:
            report["steps"].append({**asdict(step), "rc": None, "skipped": f"{left:.0f} s left of the lease's budget"})
        else:
            print(f"lease: {step.name} (up to {min(step.budget_s, int(left))} s) ...", flush=True)
            report["steps"].append(run_step(step, args.out, left))
            done = report["steps"][-1]
            print(f"lease: {step.name} exit {done['rc']}{' (timed out)' if done['timed_out'] else ''} in {done['seconds']:.0f} s",
                  flush=True)
        (args.out / "lease.json").write_text(json.dumps(report, indent=2))
    return 0 if all(s.get("rc") == 0 for s in report["steps"]) else 1


def _gpu_memory_gib() -> float:
    try:
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0
    except Exception:  # noqa: BLE001 - no GPU, or no torch: the small-GPU settings
        return 0.0


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
