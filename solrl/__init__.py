"""solrl from Python: the runs and tools of `solrl train`, `solrl eval` and `solrl infer`, for notebooks and scripts.

    import solrl

    result = solrl.train(model="tiny", iterations=30)            # prints the lines `solrl train` prints
    print(result.run_dir, result.evaluation.metrics["tinyworld_geneval.count"], result.warnings)
    scores = solrl.eval(result.run_dir)     # base (read back from the run) vs EMA, paired s.e. (`solrl eval`)
    images = solrl.infer(result.run_dir, prompt=["a red circle"])   # base beside EMA (`solrl infer`)

`train`, `evaluate` (also `solrl.eval`) and `infer` each call the one core function their command calls
(solrl_core/tools/: start.py, evaluate.py, inference.py); the API and the CLI are siblings over them.
Settings layer as on the command line (defaults < model preset < family preset < reward preset <
`config` file < `sets` < the keyword arguments). Each prints the command's plain lines as it goes
(no progress bar); `quiet=True` prints nothing, and `on_event` (every event of solrl_core/events.py)
or `on_progress(what, done, total)` ('train' iterations, 'eval base' / 'eval ema' images) replace
the printing. `train` returns a RunResult: an absolute `run_dir`, `evaluation` (the base against the
last evaluation: each metric's base, final, change and paired standard error), `warnings` and the
events (solrl/results.py). Errors are `solrl_core.errors.SolrlError`s carrying `.message` and `.fix`.
Import solrl before torch: it asks OpenMP's idle threads to sleep (OMP_WAIT_POLICY=PASSIVE, unless
set), which only works before torch loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from solrl.results import EvalReport, EvalResult, InferResult, Metric, Progress, RunResult
from solrl_core.runtime.quiet import quiet_third_party
from solrl_core.runtime.threads import prepare_openmp

__all__ = ["EvalReport", "EvalResult", "InferResult", "Metric", "RunResult", "eval", "evaluate", "infer", "train"]

# imported before torch, idle OpenMP threads sleep (solrl_core/runtime/threads.py), as under `solrl train`
prepare_openmp()


def train(model: str | None = None, family: str | None = None, reward: str | None = None, *, preset: str | None = None,
          config: str | Path | None = None, sets: Iterable[str] = (), prompts: str | Path | None = None,
          eval_prompts: str | Path | None = None, run_dir: str | Path | None = None,
          iterations: int | None = None, seed: int | None = None, device: str | None = None,
          resume: str | Path | None = None, checkpoint: str | None = None, trust_run_config: bool = False,
          quiet: bool = False, on_event: Callable[[Any], None] | None = None,
          on_progress: Progress | None = None) -> RunResult:
    """Train one run in this process (one GPU or the CPU; `solrl train --nproc-per-node N` for more),
    started as `solrl train` starts it (solrl_core/tools/start.py): the same config, and the same
    checks of its inputs and of this machine, said as a SolrlError before any model loads.
    `model` and `family` default to tiny and sol_rl. `resume`: a run folder to continue with the
    config saved there (`sets`, `iterations`, `device` and `reward` may still change what a resume may
    change). A reward plugin or URL reward that folder's config names is refused unless `reward` names
    it again or `trust_run_config=True` (a run folder is data: docs/reliability.md, Threats).
    `prompts` and `eval_prompts`: a prompt file or set (as `solrl train --prompts`; '' for `eval_prompts`
    evaluates nothing). `sets`: a list of 'section.key=value' strings."""
    quiet_third_party()  # the CLI's filters too: torch's _pytree deprecations and the backends' probes are not shown
    from solrl.results import run_report, warning_text
    from solrl_core.tools.start import RunRequest, start_run

    sets = _sets(sets)
    flags = {"run": {"iterations": iterations, "seed": seed, "device": device,
                     "run_dir": str(run_dir) if run_dir else None,
                     "prompts": str(prompts) if prompts is not None else None,
                     "eval_prompts": str(eval_prompts) if eval_prompts is not None else None}}
    start = start_run(RunRequest(model, family, reward, preset, config, sets, flags,
                                 Path(resume) if resume is not None else None, checkpoint, trust_run_config, api=True))
    bus, seen = _bus(quiet, on_event, on_progress)
    session = start.train(bus)
    return RunResult(run_dir=Path(session.run.run_dir).absolute(), iteration=session.state.iteration,
                     finished=session.state.iteration >= session.run.config.run.iterations, evaluation=run_report(seen),
                     warnings=[w for w in map(warning_text, seen) if w is not None], events=seen)


def evaluate(run: str | Path | None = None, *, model: str | None = None, prompts: str | None = None,
             seeds: int | None = None, steps: int | None = None, weights: str = "ema", checkpoint: str | None = None,
             out: str | Path | None = None, rewards: str | None = None, reward: str | None = None,
             sets: Iterable[str] = (),
             device: str | None = None, save_images: bool = False, trust_run_config: bool = False, quiet: bool = False,
             on_event: Callable[[Any], None] | None = None, on_progress: Progress | None = None) -> EvalResult:
    """`solrl eval`: the base model, or a run's checkpoint against its base (a run's kept base
    evaluation serving when it scored the same images), on fixed prompts and seeds; writes OUT
    (default RUN/eval/<time>) and returns its summary and each tuned weight set's report."""
    import json

    quiet_third_party()
    from solrl.results import summary_reports
    from solrl_core.tools.evaluate import eval_request
    from solrl_core.loop.evaluation import evaluate_weights

    req = eval_request(Path(run) if run is not None else None, model=model, reward=reward, prompts=prompts, seeds=seeds,
                       steps=steps, weights=weights, checkpoint=checkpoint, out=Path(out) if out is not None else None,
                       save_images=save_images, sets=list(_sets(sets)), device=device, rewards=rewards,
                       trust_run_config=trust_run_config)
    evaluate_weights(req, _bus(quiet, on_event, on_progress)[0])
    summary = json.loads((req.out_dir / "summary.json").read_text(encoding="utf-8"))
    return EvalResult(req.out_dir.absolute(), summary, summary_reports(summary, req.prompt_set))


eval = evaluate  # noqa: A001 - `solrl.eval(RUN)` as `solrl eval RUN`; `evaluate` where the builtin's name is in the way


def infer(run: str | Path | None = None, *, prompt: str | Iterable[str] | None = None, prompts: str | None = None,
          model: str | None = None, seeds: int = 2, seed: int = 0, steps: int | None = None, weights: str = "ema",
          checkpoint: str | None = None, out: str | Path | None = None, grid: bool = True, sets: Iterable[str] = (),
          device: str | None = None, quiet: bool = False, on_event: Callable[[Any], None] | None = None) -> InferResult:
    """`solrl infer`: images from seeds SEED..SEED+seeds-1 per prompt with the base model and a run's tuned
    weights, from the same noise; writes OUT (default RUN/infer/<time>) with a grid of them side by side."""
    quiet_third_party()
    from solrl_core.tools.inference import infer as run_infer
    from solrl_core.tools.inference import infer_request

    texts = [prompt] if isinstance(prompt, str) else list(prompt) if prompt is not None else None
    engine, req, _ = infer_request(Path(run) if run is not None else None, prompt=texts, prompts=prompts, model=model,
                                   seeds=seeds, seed=seed, steps=steps, weights=weights, checkpoint=checkpoint,
                                   out=Path(out) if out is not None else None, grid=grid, sets=list(_sets(sets)),
                                   device=device)
    index = run_infer(engine, req, _bus(quiet, on_event, None)[0])
    return InferResult(req.out_dir.absolute(),
                       index.absolute(), (req.out_dir / "grid.png").absolute() if grid else None)


def _sets(sets: Iterable[str]) -> tuple[str, ...]:
    """`sets=` as a tuple of assignments; one string is refused (iterating it would give its characters)."""
    if isinstance(sets, (str, bytes)):
        from solrl_core.errors import SolrlError

        raise SolrlError(f"sets= takes a list of 'section.key=value' strings, not one string ({sets!r})",
                         f"write sets=[{sets!r}]")
    return tuple(sets)


def _bus(quiet: bool, on_event: Callable[[Any], None] | None, on_progress: Progress | None) -> tuple[Any, list[Any]]:
    """An event bus keeping every event, telling `on_event` and `on_progress`, and printing the
    command's plain lines unless `quiet` or either callback is given."""
    from solrl.results import progress_listener
    from solrl_core import events

    bus, seen = events.EventBus(), []
    bus.subscribe(seen.append)
    if on_event is not None:
        bus.subscribe(on_event)
    if on_progress is not None:
        bus.subscribe(progress_listener(on_progress))
    if not (quiet or on_event or on_progress):
        from rich.console import Console

        from solrl_view.display import TerminalDisplay

        # plain lines wherever it runs (a notebook too): no live bar, no HTML
        bus.subscribe(TerminalDisplay(Console(highlight=False, markup=False, soft_wrap=True, force_terminal=False,
                                              force_jupyter=False)))
    return bus, seen
