"""CPU threads: the default `run.threads` alone and beside busy processes, the old default and the new.

Times one fixed short workload, the tiny world's training run cut short (`--iterations`, default
2, with run.prompts_per_iteration=4 and no evaluation; the seconds of the iterations themselves,
start-up not counted), started as a user starts it: `python -m solrl_cli train`, a fresh process
for every run, since libgomp reads its wait policy once, when torch loads it. Settings:

    old    what run.threads=0 gave before `auto`: torch's default (one thread per core in this
           process's affinity) with libgomp's default wait (idle threads spin about 300,000 turns:
           GOMP_SPINCOUNT=300000, which is that default written out)
    auto   the default now (solrl_core/runtime/threads.py): one thread per usable core, OMP_WAIT_POLICY=PASSIVE,
           and CPU lanes (runtime/lanes.py): independent batches and micro-steps side by side, one thread each
    no-lanes  auto with run.lanes=false: every op split over all the threads, as before lanes
    1      run.threads=1: one thread, nothing to spin

Each runs alone, then beside --burners busy processes (each a pure-Python spin loop: one core each,
no threads of its own), and the line per setting gives busy/alone. "Alone" means with no burner of
ours: other jobs on the machine keep running, so the 1-minute load average at the start of each run
is printed beside it. With --nproc-per-node N ..., `auto` is also timed alone with N processes
(torchrun, as `solrl train --nproc-per-node N` starts them), to show what N above the core count costs.

    python benchmarks/threads.py                                  # old, auto, no-lanes and 1; one burner
    python benchmarks/threads.py --settings auto no-lanes --iterations 4   # what lanes buy, phase by phase
    python benchmarks/threads.py --burners 2 --iterations 5 --json /tmp/threads.json
    python benchmarks/threads.py --settings auto --nproc-per-node 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from solrl_core.runtime.threads import usable_cores

SETTINGS = ("old", "auto", "no-lanes", "1")
WORKLOAD = ("run.prompts_per_iteration=4", "run.eval_prompts=", "run.checkpoint_every=1000")
OWN_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the settings decide these


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS, metavar="SETTING",
                   help=f"thread settings to time, in order (default: {' '.join(SETTINGS)})")
    p.add_argument("--burners", type=int, default=1, help="busy processes beside the busy runs (default: 1)")
    p.add_argument("--iterations", type=int, default=2, help="training iterations per run (default: 2)")
    p.add_argument("--nproc-per-node", dest="nprocs", type=int, nargs="*", default=[],
                   help="also time auto alone with each of these process counts")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra config override for every run, as solrl train --set (repeatable)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every run here")
    args = p.parse_args(argv)
    if args.burners < 1 or args.iterations < 1 or any(n < 1 for n in args.nprocs):
        p.error("--burners, --iterations and --nproc-per-node must be at least 1")
    return args


def setting_env(setting: str, cores: int) -> tuple[list[str], dict[str, str]]:
    """(--set overrides, environment) of one setting on a machine with `cores` usable cores."""
    env = {k: v for k, v in os.environ.items() if k not in OWN_ENV}
    if setting == "old":
        return [f"run.threads={cores}"], {**env, "GOMP_SPINCOUNT": "300000"}
    if setting == "auto":
        return ["run.threads=0"], env
    if setting == "no-lanes":
        return ["run.threads=0", "run.lanes=false"], env
    return [f"run.threads={setting}"], env


def time_run(setting: str, burners: int, args: argparse.Namespace, root: Path, nproc: int = 1) -> dict:
    """Train once under `setting` beside `burners` spin loops; the iterations' seconds and the threads line."""
    sets, env = setting_env(setting, usable_cores())
    run_dir = root / f"{setting}-{burners}-{nproc}"
    cmd = [sys.executable, "-m", "solrl_cli", "train", "--verbose", "--run-dir", str(run_dir), "--iterations",
           str(args.iterations),
           "--device", "cpu", *(x for s in (*WORKLOAD, *sets, *args.sets) for x in ("--set", s))]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    load = os.getloadavg()[0]
    try:
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env={**env, "COLUMNS": "1000"}, capture_output=True, text=True)  # lines unwrapped
        wall = time.perf_counter() - t0
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    seconds = [e["seconds"]["total"] for e in events if e.get("event") == "iteration"]
    phases = {k: sum(e["seconds"][k] for e in events if e.get("event") == "iteration") / max(1, len(seconds))
              for k in ("explore", "regenerate", "train")}
    threads = next((line[line.index("torch threads"):].strip() for line in done.stdout.splitlines()
                    if "torch threads" in line), "")
    return {"setting": setting, "burners": burners, "nproc": nproc, "iterations": seconds, "seconds": sum(seconds),
            "wall_s": wall, "load_at_start": load, "threads": threads, "phases": phases}


def summary(runs: list[dict], burners: int) -> list[str]:
    """One line per setting: alone, beside the burners, and busy/alone."""
    lines = []
    for setting in dict.fromkeys(r["setting"] for r in runs if r["nproc"] == 1):
        alone = next(r for r in runs if r["setting"] == setting and r["burners"] == 0 and r["nproc"] == 1)
        busy = next(r for r in runs if r["setting"] == setting and r["burners"] == burners and r["nproc"] == 1)
        lines.append(f"| {setting} | {alone['threads'] or '-'} | {alone['seconds']:.1f} (load "
                     f"{alone['load_at_start']:.1f}) | {busy['seconds']:.1f} (load {busy['load_at_start']:.1f}) | "
                     f"{busy['seconds'] / alone['seconds']:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cores = usable_cores()
    from solrl_core.telemetry.peaks import device_label

    print(f"{device_label('cpu')}; {cores} usable cores; {args.iterations} iterations of the tiny world "
          f"({', '.join(WORKLOAD + tuple(args.sets))}); burner: {args.burners} pure-Python spin loop(s)", flush=True)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="solrl-threads-") as tmp:
        for setting in args.settings:
            for burners in (0, args.burners):
                runs.append(time_run(setting, burners, args, Path(tmp)))
                r = runs[-1]
                print(f"  {setting:>4} {'alone' if not burners else f'beside {burners} burner(s)'}: {r['seconds']:.1f} "
                      f"s ({', '.join(f'{s:.1f}' for s in r['iterations'])}; load {r['load_at_start']:.1f}; an "
                      f"iteration's {', '.join(f'{k} {v:.2f}s' for k, v in r['phases'].items())}) "
                      f"{r['threads']}", flush=True)
        for nproc in args.nprocs:
            runs.append(time_run("auto", 0, args, Path(tmp), nproc))
            print(f"  auto alone, --nproc-per-node {nproc}: {runs[-1]['seconds']:.1f} s "
                  f"({', '.join(f'{s:.1f}' for s in runs[-1]['iterations'])}; load {runs[-1]['load_at_start']:.1f})",
                  flush=True)
    print(f"\n| setting | threads | alone s | beside {args.burners} burner(s) s | busy/alone |\n|---|---|---|---|---|")
    print("\n".join(summary(runs, args.burners)))
    if args.json:
        args.json.write_text(json.dumps({"cores": cores, "args": vars(args) | {"json": str(args.json)}, "runs": runs},
                                        indent=2))


if __name__ == "__main__":
    main()
