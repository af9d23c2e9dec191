"""The tiny world's frontier: held-out gain against tinyworld_fidelity's fall over the levers a user has,
each point at several run seeds, with its mean and spread over them.

A point is the tiny preset (or --model) with a few `--set` overrides; the built-in points move one lever
each from the default (POINTS below: kl_beta, learning rate, iterations, adv_clip, timestep fraction,
the prompt mix, and run.min_trade, the early stop on the trade, loop/frontier.py). Every run trains from
the pre-trained base and evaluates on the preset's evaluation set (tinyworld_eval: every held-out
caption) with tinyworld_fidelity scored on the same images, never trained on. A run's figures are those
of the evaluation `--best` names (frontier.frontier_choice at the run's run.min_trade over the verdicts
no rule flagged; with one evaluation after the base, the last): the held-out gain since the base, each
kind's gain, the fidelity change, the grain its EMA weights add to the dark background at that checkpoint
(benchmarks/grain.py, on one seed of every tinyworld_eval caption: EMA over base, 1.0 adds none), the seconds its
iterations took (evaluations apart) and the load.

Resumable: each finished run is written at once to --results (a JSON file keyed by point, the digest of
the config it trained with and seed), and a run already there is not run again, so a sweep can stop and go on later, or
on another
machine with the file copied over (each run keeps its own device and load; CPUs round differently and
RL's selection amplifies it, so the device is part of the figure).

    python benchmarks/frontier.py                                   # every point, seeds 0 1 2
    python benchmarks/frontier.py --points default kl_0.01 --seeds 0
    python benchmarks/frontier.py --points default --iterations 10 --results /tmp/pilot.json
    python benchmarks/frontier.py --point "mine=optimizer.lr=2e-4;run.iterations=10" --seeds 0 1 2
    python benchmarks/frontier.py --report-only                      # the table and figure from --results

Prints the table (mean +- standard deviation over seeds, n seeds), writes it to --table and the figure
(gain against fidelity fall, error bars one standard deviation over seeds) to --figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from _common import add_device_arg  # benchmarks/ is on sys.path when a script runs
from grain import measure as measure_grain

REWARD = "tinyworld_geneval"
FIDELITY = "tinyworld_fidelity"
KINDS = ("object", "count", "binding", "position")
# A kind whose base mean is at least this is at its ceiling (object: 0.9907 on tinyworld_eval, one image in a
# hundred short of all): it must not fall; every other kind must rise
CEILING = 0.99
DOCS = Path(__file__).resolve().parents[1] / "docs"

# name -> overrides: one lever each from the tiny preset's default (algorithm.kl_beta 0.1 since the pilot below)
POINTS: dict[str, list[str]] = {
    "default": [],
    "kl_0.01": ["algorithm.kl_beta=0.01"],
    "kl_1e-4": ["algorithm.kl_beta=1e-4"],  # the official value, the tiny preset's before the pilot
    "lr_1e-4": ["optimizer.lr=1e-4"],
    "it_3": ["run.iterations=3"],
    "it_10": ["run.iterations=10"],
    "best_every_5": ["run.eval_every=5"],  # --best over evaluations at 5, 10, ... (min_trade 0: the highest gain)
    "adv_clip_2": ["algorithm.adv_clip_max=2"],
    "tfrac_0.1": ["algorithm.timestep_fraction=0.1"],
    "mix_train": ["run.prompts=tinyworld_train"],  # the balanced mix the preset's count-weighted one replaced
    # the early stop on the trade, and --best's walk: 0.2 is the floors' ratio (tinyworld_geneval 0.02 / fidelity 0.1)
    "min_trade_0.2": ["run.eval_every=5", "run.min_trade=0.2"],
    "min_trade_0.5": ["run.eval_every=5", "run.min_trade=0.5"],
    # the pilot's points, measured at the official kl_beta before the preset moved to 0.1 (docs/BENCHMARKS.md)
    "kl_1e-4_it_3": ["algorithm.kl_beta=1e-4", "run.iterations=3"],
    "kl_1e-4_it_10": ["algorithm.kl_beta=1e-4", "run.iterations=10"],
    "kl_1e-4_min_trade_0.5": ["algorithm.kl_beta=1e-4", "run.eval_every=5", "run.min_trade=0.5"],
}
# What a run's config digest leaves out: where and how it ran, and the seed (a part of the key of its own)
NOT_DIGESTED = ("seed", "run_dir", "device", "threads")
# Settings added after runs were recorded, each at the default with which a run computes what it computed
# before the setting existed (benchmarks/same_run.py checks that): left out of the digest at that default,
# so the recorded runs stay keyed; set to anything else, digested.
LATER_SETTINGS = {"algorithm": {"loss": "nft", "awm_power": 0.25, "awm_anchor_beta": 1.0, "train_timesteps": "subset",
                                "strata": 6, "sde_eta": 0.7, "sde_kind": "sde", "clip_range": 1e-4,
                                "sde_window": 0}, "optimizer": {"steps_per_iteration": 1}}

Trainer = Callable[[list[str], int], dict[str, Any]]
Digest = Callable[[list[str]], str]


def parse_point(text: str) -> tuple[str, list[str]]:
    """NAME (a built-in point) or NAME=SECTION.KEY=VALUE[;SECTION.KEY=VALUE...]."""
    name, _, sets = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"point {text!r} has no name: write NAME or NAME=SECTION.KEY=VALUE[;...]")
    if not sets:
        if name not in POINTS:
            raise argparse.ArgumentTypeError(f"unknown point {name!r}: one of {', '.join(POINTS)}, or NAME=OVERRIDES")
        return name, list(POINTS[name])
    overrides = [s.strip() for s in sets.split(";") if s.strip()]
    bad = [s for s in overrides if "=" not in s]
    if bad:
        raise argparse.ArgumentTypeError(f"point {name!r}: {bad[0]!r} is not SECTION.KEY=VALUE")
    return name, overrides


def run_key(name: str, digest: str, seed: int) -> str:
    """The results file's key of one run: the point's name, the digest of the config it trains with, the seed."""
    return f"{name}|{digest}|seed={seed}"


def find_run(data: dict[str, Any], name: str, digest: str, seed: int) -> dict[str, Any] | None:
    """The recorded run of `name` at `seed` with this config digest; else one of another point that trained
    the same config at that seed (the same run: benchmarks/losses.py's sol_rl nft is frontier's default)."""
    if (run := data["runs"].get(run_key(name, digest, seed))) is not None:
        return run
    return next((r for r in data["runs"].values() if r.get("config") == digest and r.get("seed") == seed), None)


def config_digest(model: str, family: str = "sol_rl") -> Digest:
    """The digest of the whole config a point trains with (`model`'s and `family`'s presets, then its
    overrides), so a run measured before a preset changed is not taken for the changed preset's."""
    def digest(sets: list[str]) -> str:
        from solrl_core.config.convert import to_dict
        from solrl_core.config.presets import resolve_config

        config = to_dict(resolve_config(model, family, sets=sets))
        config["run"] = {k: v for k, v in config["run"].items() if k not in NOT_DIGESTED}
        for section, defaults in LATER_SETTINGS.items():
            config[section] = {k: v for k, v in config[section].items() if k not in defaults or v != defaults[k]}
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return digest


def load_results(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"runs": {}}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
        raise SystemExit(f"{path} is not a frontier results file (no 'runs' object): pass another --results")
    return data


def save_results(path: Path, data: dict[str, Any]) -> None:
    from solrl_core.io.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def sweep(points: list[tuple[str, list[str]]], seeds: list[int], common: list[str], results: Path,
          trainer: Trainer, digest: Digest, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (point, seed) not yet in `results`, one at a time, each written as it finishes."""
    data = load_results(results)
    for name, own in points:
        sets = [*common, *own]  # the point's own overrides win
        config = digest(sets)
        for seed in seeds:
            key = run_key(name, config, seed)
            if (kept := find_run(data, name, config, seed)) is not None:
                say(f"{name} seed {seed}: kept from {results}" + (f" (point {kept['point']})"
                                                                  if kept["point"] != name else ""))
                continue
            say(f"{name} seed {seed}: training ({' '.join(sets) or 'the preset as it is'})")
            record = trainer(sets, seed)
            data["runs"][key] = {"point": name, "sets": sets, "seed": seed, "config": config, **record}
            save_results(results, data)
            say(f"{name} seed {seed}: gain {record['gain']:+.4f}, fidelity {record['fidelity_change']:+.4f} "
                f"(iteration {record['iteration']}), {record['train_s']:.0f} s of iterations, load {record['load']}")
    return data


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, sd


def summarise(data: dict[str, Any], points: list[tuple[str, list[str]]], seeds: list[int], common: list[str],
              digest: Digest) -> list[dict]:
    """Per point (in order), over the seeds found: the mean and standard deviation of the gain, the fidelity
    change, each kind's gain and the iterations' seconds; whether every kind below the ceiling rose on
    every seed; the devices. Points with no finished run are left out."""
    out = []
    for name, own in points:
        config = digest([*common, *own])
        runs = [r for s in seeds if (r := find_run(data, name, config, s)) is not None]
        if not runs:
            continue
        row = {"point": name, "sets": own, "n": len(runs), "seeds": [r["seed"] for r in runs],
               "gain": _mean_sd([r["gain"] for r in runs]),
               "fidelity_change": _mean_sd([r["fidelity_change"] for r in runs]),
               "train_s": _mean_sd([r["train_s"] for r in runs]),
               "grain": _mean_sd([r["grain"] for r in runs]) if all("grain" in r for r in runs) else None,
               "iteration": sorted({r["iteration"] for r in runs}),
               "kinds": {k: _mean_sd([r["kinds"][k] for r in runs]) for k in KINDS
                         if all(k in r["kinds"] for r in runs)},
               "every_kind_up": all(all(g >= 0 if r["base_kinds"][k] >= CEILING else g > 0
                                        for k, g in r["kinds"].items())
                                    for r in runs),
               "flagged": sum(bool(r.get("flagged")) for r in runs), "devices": sorted({r["device"] for r in runs})}
        out.append(row)
    return out


def _pm(ms: tuple[float, float], digits: int = 4) -> str:
    return f"{ms[0]:+.{digits}f} +- {ms[1]:.{digits}f}"


def table(rows: list[dict]) -> str:
    """The markdown table: one row per point, mean +- standard deviation over its seeds."""
    lines = ["| point | overrides | seeds | held-out gain | fidelity change | " + " | ".join(KINDS)
             + " | every kind up | grain | evaluation used | iterations' s |",
             "|---|---|---|---|---|" + "---|" * len(KINDS) + "---|---|---|---|"]
    for r in rows:
        kinds = " | ".join(_pm(r["kinds"][k], 3) if k in r["kinds"] else "-" for k in KINDS)
        flagged = f" ({r['flagged']} flagged: the last used)" if r["flagged"] else ""
        lines.append(f"| {r['point']} | {'; '.join(r['sets']) or '(preset)'} | {r['n']} | {_pm(r['gain'])} | "
                     f"{_pm(r['fidelity_change'])} | {kinds} | {'yes' if r['every_kind_up'] else 'no'} | "
                     f"{f'{g[0]:.2f} +- {g[1]:.2f}' if (g := r['grain']) else '-'} | "
                     f"{', '.join(map(str, r['iteration']))}{flagged} | {r['train_s'][0]:.0f} +- {r['train_s'][1]:.0f} "
                     f"|")
    return "\n".join(lines)


def report(rows: list[dict], seeds: list[int], results: Path, table_path: Path | None,
           first_column: str = "point") -> list[str]:
    """Print the table under its command, devices and load (and write it to `table_path`); returns the devices."""
    devices = sorted({d for r in rows for d in r["devices"]})
    text = (f"command: {shlex.join([sys.executable, *sys.argv])}\ndevice: {'; '.join(devices)}\nload (uptime, now): "
            f"{load_text()}\nmean +- standard deviation over run seeds {' '.join(map(str, seeds))} (n per row); "
            f"each run's load is in {results}\n\n{table(rows).replace('| point |', f'| {first_column} |', 1)}")
    print(text)
    if table_path:
        table_path.write_text(text + "\n", encoding="utf-8")
    return devices


def figure(rows: list[dict], path: Path, title: str) -> None:
    """Held-out gain (y) against the fidelity fall (x), error bars one standard deviation over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r in rows:
        fall, gain = (-r["fidelity_change"][0], r["fidelity_change"][1]), r["gain"]
        ax.errorbar(fall[0], gain[0], xerr=fall[1], yerr=gain[1], fmt="o", capsize=3)
        ax.annotate(f"{r['point']} (n={r['n']})", (fall[0], gain[0]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.set_xlabel(f"{FIDELITY} fall since the base (lower is better)")
    ax.set_ylabel(f"held-out {REWARD} gain since the base")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_text() -> str:
    """`uptime`'s load averages (os.getloadavg where uptime is missing)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              timeout=5).stdout.strip().split("load average")[-1].lstrip("s: ")
    except (OSError, subprocess.SubprocessError):
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def train_point(args: argparse.Namespace) -> Trainer:
    """The real trainer: one tiny run of `sets` at `seed`, its figures at the evaluation --best names."""
    def run(sets: list[str], seed: int) -> dict[str, Any]:
        from solrl_core import events as ev
        from solrl_core.config.presets import resolve_config
        from solrl_core.loop.frontier import frontier_choice
        from solrl_core.loop.trainer import train
        from solrl_core.telemetry.peaks import device_label

        evals: dict[int, Any] = {}
        train_s = [0.0]

        def collect(e: ev.Event) -> None:
            if isinstance(e, ev.EvalFinished):
                evals[e.iteration] = e
                trade = "".join(f", {t:.3g} gain per unit of {n} lost since {e.trade_since}"
                                for n, t in e.trade.items())
                print(f"  evaluation at iteration {e.iteration}: held-out {e.mean:.4f}, "
                      + ", ".join(f"{n} {v:.4f}" for n, v in e.eval_rewards.items()) + trade, flush=True)
            elif isinstance(e, ev.RunWarning):
                print(f"  warning: {e.message}", flush=True)
            elif isinstance(e, ev.IterationFinished):
                train_s[0] += e.seconds["total"]

        bus = ev.EventBus()
        bus.subscribe(collect)
        load_before, t0 = load_text(), time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="frontier-") as tmp:
            where = [f"run.seed={seed}", f"run.run_dir={tmp}/run", f"run.device={args.device}",
                     f"run.threads={args.threads}"]
            cfg = resolve_config(args.model, getattr(args, "family", "sol_rl"), sets=[*sets, *where])
            session = train(cfg, bus)
            good = [v for v in session.state.evaluations if not v["flagged"] and v["iteration"] > 0]
            chosen = frontier_choice(good, cfg.run.min_trade)[0]["iteration"] if good else session.state.iteration
            grain = measure_grain(Path(tmp) / "run", cfg.run.eval_prompts or cfg.run.prompts, 1, f"iter_{chosen:06d}")
        base, now = evals[0], evals[chosen]
        return {"gain": now.mean - base.mean, "fidelity_change": now.eval_changes[FIDELITY], "iteration": chosen,
                "last_iteration": session.state.iteration, "flagged": not good,
                "kinds": {k: now.extras[f"{REWARD}.{k}"] - base.extras[f"{REWARD}.{k}"] for k in KINDS
                          if f"{REWARD}.{k}" in now.extras},
                "base_kinds": {k: base.extras[f"{REWARD}.{k}"] for k in KINDS if f"{REWARD}.{k}" in base.extras},
                "grain": grain["ratio"], "gain_se": now.delta_se.get("mean", 0.0), "train_s": train_s[0],
                "wall_s": time.perf_counter() - t0,
                "device": device_label(session.run.device), "load": f"{load_before} -> {load_text()}",
                "command": shlex.join([sys.executable, *sys.argv])}
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="model preset (default: tiny, the pre-trained tiny world)")
    add_device_arg(p)  # run.device: auto resolved by the run, as solrl train resolves it
    p.add_argument("--threads", type=int, default=0, help="run.threads (0 = auto: one per usable core)")
    p.add_argument("--points", nargs="+", type=parse_point, metavar="NAME", help=f"built-in points (default: all: "
                                                                                 f"{' '.join(POINTS)})")
    p.add_argument("--point", dest="extra", action="append", default=[], type=parse_point, metavar="NAME=OVERRIDES",
                   help="a point of your own, overrides separated by ';' (repeatable)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="run seeds of every point (default: 0 1 2)")
    p.add_argument("--iterations", type=int, help="run.iterations for every point that does not set its own")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="an override for every point, before the point's own (repeatable)")
    p.add_argument("--results", type=Path, default=Path("frontier_results.json"), help="the resumable results file")
    p.add_argument("--table", type=Path, help="also write the table (markdown) here")
    p.add_argument("--figure", type=Path, default=DOCS / "frontier.png", help="the figure (default: docs/frontier.png)")
    p.add_argument("--report-only", action="store_true", help="train nothing: the table and figure from --results")
    args = p.parse_args(argv)
    args.points = (args.points if args.points is not None
                   else ([] if args.extra else [(n, list(s)) for n, s in POINTS.items()]))
    args.points += args.extra
    args.common = [*([f"run.iterations={args.iterations}"] if args.iterations else []), *args.sets]
    return args


def main(argv: list[str] | None = None, trainer: Trainer | None = None, digest: Digest | None = None) -> list[dict]:
    args = parse_args(argv)
    digest = digest or config_digest(args.model)
    if args.report_only:
        data = load_results(args.results)
    else:
        data = sweep(args.points, args.seeds, args.common, args.results, trainer or train_point(args), digest)
    rows = summarise(data, args.points, args.seeds, args.common, digest)
    if not rows:
        print(f"no finished run of these points and seeds in {args.results}")
        return rows
    devices = report(rows, args.seeds, args.results, args.table)
    figure(rows, args.figure, f"tiny world: held-out gain vs {FIDELITY} fall, mean +- sd over "
                              f"seeds\n{'; '.join(devices)}")
    print(f"figure: {args.figure}")
    return rows


if __name__ == "__main__":
    main()
