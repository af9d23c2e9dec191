"""The one command a lent GPU runs first: the measurements in order of value, each under its own time
limit, within the lease's budget, each writing what it measured as soon as it has it.

    python benchmarks/lease.py --plan --gpu h200           # the steps, their limits, expected times, the total
    python benchmarks/lease.py                             # on the lent GPU (--out defaults to $OUT, else ./lease-out)
    python benchmarks/lease.py --size tiny --device auto   # every step's code at tiny size, on any machine (CI runs it)

The steps (docs/gpu-lease.md): `probes`, every CUDA call no GPU has run yet, each in a subprocess of
its own (benchmarks/cuda_probes.py); `flux1`, FLUX.1-12B sol_rl against compile, one warm-up and one
measured iteration per family, compile mode `default`; `sana`, SANA-1.6B both families with TF32,
when about 200 s remain; `selftest`, the self-test's CUDA-only rows; `pytest_gpu`, `pytest -m gpu`;
`explore_step` and `wan` with what is left. The first two always start: the plan is refused when
their limits exceed --budget. Each later one starts only with its `needs` left, and runs under the
smaller of its limit and what is left. A step's output goes to OUT/<step>.log, its figures to
OUT/<step>.json as soon as it has them (`solrl bench` after each family), and OUT/lease.json is
rewritten after every step (command, exit code, seconds, timed out or not; which steps ran and
passed), so a lease cut off still returns everything measured so far. A step that fails does not
stop the next. --device is resolved once here (auto: cuda when torch sees a GPU) and passed on as
given: every script takes auto.

At --size tiny the same steps run on tiny models: the probes on the device, the benches with sol_rl
only (a CPU compiles a copy in about a minute), every self-test row the device can run, `pytest -m gpu`
on the test modules that hold GPU tests (collected, skipped without a GPU), each step up to 300 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SOLRL = [sys.executable, "-m", "solrl_cli"]
MIN_STEP_S = 20  # a step that may start anyway is not started with less than this left
TINY_LIMIT_S = 300  # each step's limit at --size tiny (a shared, loaded CPU)
CUDA_ROWS = "explore/fp8,explore/nvfp4,explore/fp8-e5m2-delayed,family/compile,compile/*,memory/*,fsdp/multi-process"
GPUS = {"h100": "NVIDIA H100 80GB", "h200": "NVIDIA H200 141GB", "b200": "NVIDIA B200 180GB"}
BIG_GIB = 120  # an H200-class memory: FLUX.1 at the official N=96, K=24 (else N=24, K=12, as measured on the H100)
H100_LOG = "docs/BENCHMARKS.md, 'On an NVIDIA H100, 2026-11-27' (docs/gpu/2026-11-27-h100-flux-iteration-sol-rl.log)"
H100_SANA = "docs/BENCHMARKS.md, 'On an NVIDIA H100, 2026-11-24' (docs/gpu/2026-11-24-h100-iteration-sana.json)"
# Expected seconds per step on a GPU: ESTIMATES from the H100 figures recorded in docs/BENCHMARKS.md
# (an H200 has the H100's compute, a B200 more: no figure from either), with how each was derived.
# FLUX.1 at N=24 K=12: 56 s to the first family (start, build, reward network), 116 s of compiling
# (explore copy 27.6, rollout copy 19.0, update 69.0), 15.4 s a sol_rl iteration; a compile iteration
# 17.0 s (10 bf16 steps at 0.896 s, the compiled FLUX step at batch 24, + reward 0.15 + train 7.88).
# At N=96 K=24: explore x4, regenerate and train x2: 37.7 s a sol_rl iteration; compile 4 batches x 10
# steps x 0.896 + reward 0.6 + train 15.8 = 52.2 s. SANA-1.6B (N=96 K=24): 118 s compiling, 10.35 s
# a sol_rl and 11.50 s a compile iteration; start and build not recorded (30 s assumed).
ESTIMATES: dict[str, dict[str, tuple[int, str]]] = {
    "flux1": {"small": (56 + 116 + 2 * 15 + 2 * 17 + 5, f"N=24 K=12: {H100_LOG}: build 56 s, compile 116 s, "
                        "sol_rl 15.4 s/it; compile 17.0 s/it derived from its step time"),
              "big": (56 + 116 + 2 * 38 + 2 * 52 + 5, f"N=96 K=24, scaled from N=24 K=12: {H100_LOG}: build 56 s, "
                                                      f"compile "
                      "116 s, sol_rl 37.7 s/it, compile 52.2 s/it (derived)")},
    "sana": {"any": (30 + 118 + 2 * 10 + 2 * 12 + 5, f"{H100_SANA}: compile 118 s, sol_rl 10.35 s/it, compile 11.50 "
                                                     f"s/it; "
                     "build 30 s assumed")},
}


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    limit_s: int
    needs_s: int | None = None  # None: always starts (its limit reserved); else starts only with this much left
    writes: list[str] = field(default_factory=list)  # the JSON files it writes under OUT
    what: str = ""


def steps(size: str, device: str, out: Path, big_gpu: bool) -> list[Step]:
    """The lease's steps in order of value. `big_gpu`: an H200-class memory (the official N=96, K=24 for FLUX.1)."""
    tiny = size == "tiny"
    at = ["--size", size, "--device", device]
    few = ["--n", "4", "--k", "2", "--rollout-batch", "4"] if tiny else []
    both = ["--family", "sol_rl"] + ([] if tiny else ["--family", "compile"])
    flux_nk = [] if tiny else (["--n", "96", "--k", "24"] if big_gpu
                               else ["--n", "24", "--k", "12", "--rollout-batch", "12"])
    once = ["--iterations", "2", "--warmup", "1", "--compile-mode", "default"]  # one warm-up, one measured iteration
    gpu_tests = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").glob("test_*.py"))
                 if re.search(r"mark\.gpu\b", p.read_text())] if tiny else ["tests"]
    plan = [
        Step("probes", [sys.executable, str(BENCH / "cuda_probes.py"), "--device", device, "--budget", "70",
                        "--json", str(out / "probes.json")], 75, None, ["probes.json"],
             "every CUDA call no GPU has run yet, each in its own subprocess (cuda_probes.py)"),
        Step("flux1", [*SOLRL, "bench", "--model", "flux1", *at, *both, *flux_nk, *few, *once, "--real-vae",
                       "--reward-model", "pickscore", "--json", str(out / "flux1.json")], 380, None, ["flux1.json"],
             "FLUX.1-12B sol_rl against compile, published VAE, PickScore-size reward"),
        Step("sana", [*SOLRL, "bench", "--model", "sana", *at, *both, *few, *once, "--set", "run.tf32=true",
                      "--json", str(out / "sana.json")], 200, 200, ["sana.json"], "SANA-1.6B sol_rl against compile, "
                                                                                  "TF32"),
        Step("selftest", [*SOLRL, "doctor", "--selftest", "--device", device, "--json-out", str(out / "selftest.json"),
                          "--explore-precision", "fp8-e5m2-delayed", "--set", "run.compile_mode=default",
                          *([] if tiny else ["--only", CUDA_ROWS])], 120, 60,
             ["selftest.json"],
             "every self-test row the device runs" if tiny else "the self-test's CUDA-only rows"),
        Step("pytest_gpu", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-o",
                            "addopts=",
                            "-p", "no:xdist", *gpu_tests], 90, 45, [], "pytest -m gpu (every test module collected)"),
        Step("explore_step", [sys.executable, str(BENCH / "explore_step.py"), *at,
                              *(["--models", "sana", "--backends", "bf16", "nvfp4-emulated", "--batch", "2", "--warmup",
                                 "1",
                                 "--repeats", "1"] if tiny else
                                ["--models", "flux", "--backends", "bf16", "fp8", "fp8-torchao", "--compile",
                                 "--compile-mode",
                                 "default", "--warmup", "2", "--repeats", "5"]),
                              "--json", str(out / "explore_step.json")], 150, 60, ["explore_step.json"],
             "one FLUX.1 denoising step per explore backend, eager and compiled"),
        Step("wan", [*SOLRL, "bench", "--model", "wan21_t2v_1_3b", *at, "--family", "sol_rl", *few, *once,
                     "--json", str(out / "wan.json")], 150, 100, ["wan.json"], "a Wan 2.1 1.3B sol_rl iteration"),
    ]
    if tiny:
        return [Step(s.name, s.command, TINY_LIMIT_S, MIN_STEP_S, s.writes, s.what) for s in plan]
    return plan


def planned(chosen: list[Step], budget: int, estimates: dict[str, tuple[int, str] | None]) -> list[dict]:
    """Each step with its limit, when it is expected to start, whether it is expected to start (the
    reserved steps always, the others when their `needs` is left after the expected times before them)
    and its expected seconds: an estimate where one is recorded, else the most it may take."""
    rows, spent = [], 0
    for step in chosen:
        left = budget - spent
        starts = step.needs_s is None or left >= step.needs_s
        limit = step.limit_s if step.needs_s is None else min(step.limit_s, left)
        estimate = estimates.get(step.name)
        expected = (min(estimate[0], limit) if estimate else limit) if starts else 0
        rows.append({"name": step.name, "limit_s": step.limit_s, "needs_s": step.needs_s, "expected_start_s": spent,
                     "expected_to_start": starts, "expected_s": expected, "estimated": estimate is not None,
                     "basis": estimate[1] if estimate else "no recorded figure: the most it may take",
                     "what": step.what})
        spent += expected
    return rows


def refuse_over_budget(chosen: list[Step], budget: int) -> str:
    """'' when the steps that always start fit in `budget`, else why not (one line)."""
    reserved = [s for s in chosen if s.needs_s is None]
    total = sum(s.limit_s for s in reserved)
    if total <= budget:
        return ""
    parts = " + ".join(f"{s.name} {s.limit_s}" for s in reserved)
    return (f"the steps that always start need {parts} = {total} s, over --budget {budget} s: raise --budget or lower "
            f"their limits")


def estimates_for(gpu: str) -> dict[str, tuple[int, str] | None]:
    big = "big" if gpu != "h100" else "small"
    return {"flux1": ESTIMATES["flux1"][big], "sana": ESTIMATES["sana"]["any"]}


def print_plan(chosen: list[Step], budget: int, gpu: str) -> None:
    rows = planned(chosen, budget, estimates_for(gpu))
    print(f"lease plan on an {GPUS[gpu]} (--gpu {gpu}), --budget {budget} s. A PLAN, not a measurement: expected times "
          "are ESTIMATES from the H100 figures recorded in docs/BENCHMARKS.md (an H200 computes as an H100; no B200 "
          "figure).")
    print(f"{'step':<13}{'limit':>7}  {'starts':<18}{'at':>7}  {'expected':<22}basis")
    for r in rows:
        starts = "always" if r["needs_s"] is None else f"if {r['needs_s']} s left"
        if not r["expected_to_start"]:
            expect = f"- ({budget - r['expected_start_s']} s left)"
        else:
            expect = f"~{r['expected_s']} s (estimate)" if r["estimated"] else f"<= {r['expected_s']} s"
        print(f"{r['name']:<13}{r['limit_s']:>5} s  {starts:<18}{r['expected_start_s']:>5} s  {expect:<22}"
              f"{r['basis'] if r['expected_to_start'] else 'not expected to start'}")
    reserved = sum(s.limit_s for s in chosen if s.needs_s is None)
    running = [r for r in rows if r["expected_to_start"]]
    print(f"total: {reserved} s of limits for the steps that always start, within --budget {budget} s; expected "
          f"{sum(r['expected_s'] for r in running)} s for {', '.join(r['name'] for r in running)}. A later step runs "
          "under the smaller of its limit and what is left: none runs past the budget, and one starts early when "
          "the steps before it finish early.")


def run_step(step: Step, out: Path, left_s: float) -> dict:
    """Run one step under min(its limit, what is left); its output into OUT/<name>.log."""
    limit = int(min(step.limit_s, left_s))
    start = time.monotonic()
    log = out / f"{step.name}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(step.command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # its own session: the step's children (torchrun's workers, probes) go with it
            rc, timed_out = proc.wait(), True
    return {**asdict(step), "limit_s": limit, "rc": rc, "timed_out": timed_out, "seconds": time.monotonic() - start,
            "log": log.name, "written": [w for w in step.writes if (out / w).exists()],
            "passed": rc == 0 and not timed_out}


def main(argv: list[str] | None = None) -> int:
    from _common import add_device_arg, resolved_device  # benchmarks/ is on sys.path when a script runs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="real", choices=("real", "tiny"), help="real: published sizes (a GPU); tiny: any "
                                                                            "machine")
    add_device_arg(p)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "lease-out"), help="output folder ($OUT "
                                                                                                "if set)")
    p.add_argument("--budget", type=int, default=540, help="seconds for all steps together (default 540: a cold "
                                                           "machine's 9 minutes)")
    p.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps")
    p.add_argument("--plan", action="store_true", help="print the steps, their limits, expected times and the total; "
                                                       "run nothing")
    p.add_argument("--gpu", choices=tuple(GPUS),
                   help="--plan: the GPU to plan for (default: this machine's, else h200)")
    args = p.parse_args(argv)
    device = "cpu" if args.plan and args.gpu else resolved_device(args.device)  # once: what this lease runs on
    gib = _gpu_memory_gib() if device.startswith("cuda") else 0.0
    gpu = args.gpu or ("h200" if gib >= BIG_GIB or not gib else "h100")
    big = gpu != "h100" if args.plan else gib >= BIG_GIB
    chosen = [s for s in steps(args.size, args.device, args.out.resolve(), big) if not args.only or s.name in args.only]
    if args.size == "real" and (why := refuse_over_budget(chosen, args.budget)):
        print(f"lease: refused: {why}", file=sys.stderr)
        return 2
    if args.plan:
        print_plan(chosen, args.budget, gpu)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    report: dict = {"size": args.size, "device": args.device, "resolved_device": device, "budget_s": args.budget,
                    "commit": _commit(), "steps": [], "ran": [], "passed": []}
    for step in chosen:
        left = deadline - time.monotonic()
        if left < (step.needs_s if step.needs_s is not None else MIN_STEP_S):
            report["steps"].append({**asdict(step), "rc": None, "passed": False, "skipped": f"{left:.0f} s left of the "
                                                                                            f"budget"})
            print(f"lease: {step.name} skipped: {left:.0f} s left, it needs {step.needs_s or MIN_STEP_S} s", flush=True)
        else:
            print(f"lease: {step.name} (up to {int(min(step.limit_s, left))} s) ...", flush=True)
            done = run_step(step, args.out, left)
            report["steps"].append(done)
            report["ran"].append(step.name)
            report["passed"] += [step.name] if done["passed"] else []
            print(f"lease: {step.name} exit {done['rc']}{' (timed out)' if done['timed_out'] else ''} in "
                  f"{done['seconds']:.0f} s",
                  flush=True)
        (args.out / "lease.json").write_text(json.dumps(report, indent=2))
    return 0 if report["passed"] == [s.name for s in chosen] else 1


def _gpu_memory_gib() -> float:
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
