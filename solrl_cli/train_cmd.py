"""`solrl train`: the flags made into a run request for solrl_core/tools/start.py, the door
`solrl.train()` comes in by too (resolve the config or the saved one, check the inputs and the
machine); then train here, in the TUI or with the plain display, or start torchrun (launch.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from solrl_cli import options as opt
from solrl_cli.common import PRECEDENCE, console
from solrl_cli.errors import user_errors

Resume = Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in this folder from its newest "
                                                                 "checkpoint (checked against its manifest).")]
ResumeCheckpoint = Annotated[Optional[str], typer.Option("--checkpoint", help="With --resume: the checkpoint to "
                                                                              "continue from (iter_000030); newer ones "
                                                                              "are set aside. Default: the newest.")]
Log = Annotated[Optional[str], typer.Option("--log", help="Experiment trackers, comma-separated: tensorboard, wandb "
                                                          "(run.log; needs pip install -e "
                                                          "\".\\[tracking]\").")]  # help is rich markup: \\[ shows a [
Tui = Annotated[bool, typer.Option("--tui", help="Watch the run in a terminal UI; q asks whether to stop safely with a "
                                                 "checkpoint.")]
Nproc = Annotated[int, typer.Option("--nproc-per-node", min=1, help="Processes (one per GPU) on this node; above 1 "
                                                                    "they are started through torchrun.")]
Nnodes = Annotated[int, typer.Option("--nnodes", min=1, help="Nodes in the run; start the same command on each with "
                                                             "its --node-rank.")]
NodeRank = Annotated[int, typer.Option("--node-rank", min=0, help="This node's index, 0 to nnodes-1.")]
Rdzv = Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0 (needed with --nnodes > 1).")]
MasterAddr = Annotated[Optional[str], typer.Option("--master-addr", help="torchrun's name for node 0's address: the "
                                                                         "same as --rdzv-endpoint ADDR:PORT.")]
MasterPort = Annotated[Optional[int], typer.Option("--master-port", help="torchrun's name for node 0's port (default "
                                                                         "29500), with --master-addr.")]
NoEval = Annotated[bool, typer.Option("--no-eval", help="Skip the evaluations (the same as --set run.eval_prompts=): "
                                       "faster, but no held-out scores, warnings of reward hacking or pictures.")]
Verbose = Annotated[bool, typer.Option("--verbose", help="Print the machine's plan, the model's FLOPs and each "
                                       "iteration's phase times, memory and MFU in full (always in RUN/events.jsonl).")]
Loss = Annotated[Optional[str], typer.Option("--loss", help="The update's loss: nft (the default, Sol-RL's), awm "
                                                           "(Advantage Weighted Matching) or flow_grpo (Flow-GRPO); "
                                                           "algorithm.loss.")]
DumpConfig = Annotated[bool, typer.Option("--dump-config", help="Print the resolved config as TOML and exit.")]


def train(
    model: opt.Model = None, model_path: opt.ModelPath = None, family: opt.Family = None, reward: opt.Reward = None,
    preset: opt.Preset = None, config: opt.ConfigFile = None, set_: opt.Sets = None, prompts: opt.Prompts = None,
    run_dir: opt.RunDir = None, iterations: opt.Iterations = None, seed: opt.Seed = None, device: opt.Device = None,
    explore_precision: opt.ExplorePrecision = None, resume: Resume = None, checkpoint: ResumeCheckpoint = None,
    log: Log = None, tui: Tui = False, nproc_per_node: Nproc = 1, nnodes: Nnodes = 1, node_rank: NodeRank = 0,
    rdzv_endpoint: Rdzv = None, master_addr: MasterAddr = None, master_port: MasterPort = None,
    no_eval: NoEval = False, dump_config: DumpConfig = False, trust_run_config: opt.TrustRunConfig = False,
    verbose: Verbose = False, loss: Loss = None,
) -> None:
    """Train with Sol-RL (or another family). With no arguments: the built-in tiny model on this machine."""
    from solrl_core.tools.start import RunRequest, resolve, start_run

    with user_errors():
        flags = {"run": {"prompts": prompts, "run_dir": str(run_dir) if run_dir else None, "iterations": iterations,
                         "seed": seed, "device": device, "log": _trackers(log)},
                 "explore": {"precision": explore_precision}, "algorithm": {"loss": loss},
                 "model": {"path": str(model_path) if model_path else None}}
        sets = (*(set_ or ()), *(["run.eval_prompts="] if no_eval else []))  # as a --set: a resume may take it too
        request = RunRequest(model, family, reward, preset, config, sets, flags, resume, checkpoint,
                             trust_run_config, nproc_per_node, nnodes)
        if dump_config:
            return _print_config(resolve(request))
        start = start_run(request)  # the input checks and the preflight, as solrl.train() runs them
        if start.torchrun:  # torch.distributed's own launcher re-runs this command per process
            from solrl_cli.launch import endpoint, launch, torchrun_args

            node0 = endpoint(rdzv_endpoint, master_addr, master_port)
            torchrun_args(nproc_per_node, nnodes, node_rank, node0)  # the launcher's flags checked before a long note
            if start.note:  # more processes than cores on a CPU; seed-for-seed parting
                console.print(start.note, soft_wrap=True)
            raise typer.Exit(launch(nproc_per_node, nnodes, node_rank, node0,
                                    sys.argv[1:], prompts_per_iteration=start.config.run.prompts_per_iteration,
                                    run_dir=str(resume or start.config.run.run_dir)))
        session = _run(start, tui, verbose)
        if not session.state.finished(session.run.config.run.iterations):  # saved, but not finished
            # the run's own rule stopped it (on_hacking), else a signal did (its last evaluation may be due)
            raise typer.Exit(STOPPED_BY_RULE if session.state.stopped_by_rule else 130)


STOPPED_BY_RULE = 3  # exit code: the run's own rule stopped it (on_hacking=stop, its last rollback, run.min_trade)


def _run(start, tui: bool, verbose: bool = False):  # type: ignore[no-untyped-def]
    """Train in the terminal UI, or with the plain terminal display (also when --tui has no terminal,
    or in a torchrun process other than rank 0: solrl_cli/tui/__init__.py decides)."""
    if tui:
        from solrl_cli.tui import no_terminal

        why = no_terminal()
        if why:
            console.print(f"--tui needs a terminal ({why}): showing the plain display instead")
        tui = why is None
    if tui:
        from solrl_cli.tui.app import run_tui_training

        return run_tui_training(start)
    from solrl_view.display import TerminalDisplay
    from solrl_core import events

    bus = events.EventBus()
    bus.subscribe(TerminalDisplay(console, verbose))
    return start.train(bus)


def _trackers(log: Optional[str]) -> Optional[list[str]]:
    return [t.strip() for t in log.split(",") if t.strip()] if log is not None else None


def _print_config(cfg) -> None:  # type: ignore[no-untyped-def]
    import tomli_w

    from solrl_core.config.convert import to_dict

    print(f"# solrl resolved config for preset {cfg.preset}\n# precedence: {PRECEDENCE}")
    print(tomli_w.dumps(to_dict(cfg)), end="")
