"""The rows of `solrl doctor --selftest` (selftest.py): each one path a run takes, on this machine.

Models: the tiny world (the `tiny` preset's pretrained weights) and, for SANA, FLUX.1, SD3 and Wan,
the bench's random-weight pipelines of the real architectures at tiny width (bench/build.py), built
once per self-test. Each run is one iteration (two for the resume), one prompt group of 4 seeds, 2
kept, eval off, through `train` itself. CUDA-only rows (fp8 and nvfp4 explore, the compiled copies,
the memory modes that move tensors between CPU and GPU, a multi-process fsdp run) are chosen from
the device's compute capability and GPU count, and skipped elsewhere with the reason.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from solrl_core.config.choices import LOSSES
from solrl_core.doctor.selftest_base import Context, Row
from solrl_core.errors import SolrlError
from solrl_core.io.rundir import EVENTS_FILE

MODELS = ("sana", "flux1", "sd3", "wan21_t2v_1_3b")
FAMILIES = ("compile", "naive_scaling", "naive_quant", "diffusionnft")
EXPLORE = ("nvfp4-emulated", "fp8-e5m2-tensor", "fp8", "nvfp4")
MEMORY_MODES = ("cpu-whole", "cpu-blocks")
# One prompt group of 4 seeds, 2 kept, short samplers: each run is the code path, not a measurement.
SMALL = ("explore.group_size=4", "selection.group_size=2", "explore.steps=2", "sampler.steps=3", "sampler.eval_steps=3",
         "run.prompts_per_iteration=1", "sampler.rollout_batch=4", "optimizer.micro_batch=2",
         "algorithm.timestep_fraction=0.5", "run.eval_prompts=")
# the bench's tiny SANA is 32 wide: the preset's size rule would keep every layer out of the explore copy
RANDOM = ("model.quant_min_dim=0", "run.prompts=general")
CPU_COMPILE = "torch.compile costs about a minute a copy on a CPU; it runs where a GPU is"


def rows(ctx: Context) -> list[Row]:
    out = [Row("tiny-world/sol_rl", _tiny_world)]  # and the default loss, nft
    out += [Row(f"loss/{loss}", functools.partial(_loss, loss)) for loss in LOSSES if loss != "nft"]
    out += [Row(f"model/{p}", functools.partial(_model, p)) for p in MODELS]
    out += [Row(f"family/{f}", functools.partial(_family, f),
                skip=_cuda_only(CPU_COMPILE) if f == "compile" else _always)
            for f in FAMILIES]
    out += [Row(f"explore/{p}", functools.partial(_explore, p), skip=functools.partial(_precision_skip, p),
                fix=f"use an explore precision this machine runs (`solrl doctor` lists them), not {p}")
            for p in _precisions(ctx)]
    out.append(Row("compile/copies+update", _compiled, skip=_cuda_only(CPU_COMPILE)))
    out += [Row("rollout-copy", functools.partial(_sana, ("sampler.rollout_copy=true",))),
            Row("calibration", functools.partial(_sana, ("explore.calibrate=steps+precision",))),
            Row("rank-check", functools.partial(_sana, ("explore.rank_check_every=1",)))]
    out += [Row(f"memory/{m}", functools.partial(_sana, (f"memory.copies={m}", "sampler.rollout_copy=true")),
                skip=_cuda_only("moves tensors between the CPU and a GPU: this machine runs on the CPU"))
            for m in MEMORY_MODES]
    out.append(Row("checkpoint+resume+export", _checkpoint, skip=lambda c: None if c.export else "no export function "
                                                                                                 "given"))
    out.append(Row("reward-server", _reward_server, skip=_server_skip,
                   fix="start `solrl reward-server` alone to see its own error (docs/remote-rewards.md)"))
    if ctx.reward:
        out.append(Row(f"reward/{ctx.reward}", _reward,
                       fix=f"fix or replace the reward {ctx.reward} (docs/rewards.md)"))
    out += [Row("fsdp/1-process", _fsdp_one, skip=_dist_skip),
            Row("fsdp/multi-process", _fsdp_many, skip=_many_skip)]
    return out


def _always(ctx: Context) -> str | None:
    return None


def _cuda_only(why: str) -> Any:
    return lambda ctx: None if ctx.cuda else why


def _precisions(ctx: Context) -> tuple[str, ...]:
    return EXPLORE + ((ctx.precision,) if ctx.precision and ctx.precision not in EXPLORE else ())


def _precision_skip(precision: str, ctx: Context) -> str | None:
    """None where it runs here, or what the user named with --explore-precision (then its own refusal is the row's
    failure)."""
    from solrl_core.precision.hardware import IMPLEMENTED_EXPLORE, explore_precisions

    if precision == ctx.precision:
        return None
    ok, why = explore_precisions(ctx.gpu, ctx.torchao_missing).get(precision, (False, "unknown"))
    if not ok:
        return why
    return (None if precision in IMPLEMENTED_EXPLORE else f"{why}, but real {precision} explore kernels are not in "
                                                          f"this version")


def _server_skip(ctx: Context) -> str | None:
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed (solrl[server])" if missing else None


def _dist_skip(ctx: Context) -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch has no torch.distributed"
    if ctx.cuda and not dist.is_nccl_available():
        return "this torch has no NCCL"
    if not ctx.cuda and not dist.is_gloo_available():
        return "this torch has no gloo"
    return "torch.distributed is already started in this process" if dist.is_initialized() else None


def _many_skip(ctx: Context) -> str | None:
    """One process per GPU, so 2 GPUs or more. It runs on a CPU too (2 gloo ranks), but costs a minute
    there, more than the rest of the self-test; tests/test_fsdp.py runs 2 gloo ranks in CI."""
    return _dist_skip(ctx) or (None if ctx.gpu_count >= 2 else
                               f"needs 2 or more GPUs, one per process (this machine has {ctx.gpu_count})")


def _train(cfg: Any, resume: bool = False) -> Any:
    from solrl_core import events as ev
    from solrl_core.loop.trainer import StopFlag, train

    return train(cfg, ev.EventBus(), resume=resume, stop=StopFlag())


def _config(ctx: Context, name: str, preset: str, family: str, *sets: str, reward: str | None = None) -> Any:
    """A one-iteration config of `preset` (a bench-built random pipeline unless it is the tiny world)."""
    from solrl_core.bench.run import REWARD
    from solrl_core.config.presets import resolve_config

    model = [] if preset == "tiny" else [f"model.path={_pipeline(ctx, preset)}",
                                         f"model.resolution={ctx.built[preset + ':resolution']}", *RANDOM]
    return resolve_config(preset, family, reward or (None if preset == "tiny" else REWARD), sets=[
        *SMALL, *model, "run.iterations=1", "run.checkpoint_every=1", f"run.device={ctx.device}",
        f"run.run_dir={ctx.root / 'runs' / name.replace('/', '-')}", *ctx.sets, *sets])


def _pipeline(ctx: Context, preset: str) -> Path:
    """The bench's tiny random pipeline of `preset`, built once per self-test."""
    if preset not in ctx.built:
        import diffusers
        import huggingface_hub
        import transformers

        from solrl_core.bench.build import bench_model, build_pipeline
        from solrl_core.config.presets import resolve_config

        huggingface_hub.utils.disable_progress_bars()  # a row's progress is one line, not a bar per saved file
        transformers.utils.logging.disable_progress_bar()
        diffusers.utils.logging.disable_progress_bar()
        base = resolve_config(preset, "sol_rl").model
        model = bench_model(preset, base.loader, base.resolution, "tiny", frames=base.frames)
        ctx.built[preset] = build_pipeline(model, ctx.root / "models" / preset, "cpu")
        ctx.built[preset + ":resolution"] = model.resolution
    return ctx.built[preset]


def _said(session: Any) -> str:
    """What the run took, in a few words: model, family and the plan's switches."""
    run, m = session.run, session.run.machine
    compiled = {True: " compiled", False: ""}
    return (f"{run.config.model.name} {run.config.algorithm.family}, {session.state.iteration} iteration(s): explore "
            f"{m.explore_precision}{compiled[m.explore_compile]}, rollout copy {'on' if m.rollout_copy else 'off'}"
            f"{compiled[m.rollout_copy and m.rollout_compile]}, update {'compiled' if m.update_compile else 'eager'}, "
            f"memory {m.memory.copies}, {m.strategy}")


def _tiny_world(ctx: Context) -> str:
    return _said(_train(_config(ctx, "tiny-world", "tiny", "sol_rl")))


def _loss(loss: str, ctx: Context) -> str:
    return f"loss {loss}: " + _said(_train(_config(ctx, f"loss-{loss}", "tiny", "sol_rl", f"algorithm.loss={loss}")))


def _model(preset: str, ctx: Context) -> str:
    return _said(_train(_config(ctx, f"model-{preset}", preset, "sol_rl")))


def _family(family: str, ctx: Context) -> str:
    return _said(_train(_config(ctx, f"family-{family}", "sana", family)))


def _explore(precision: str, ctx: Context) -> str:
    return _said(_train(_config(ctx, f"explore-{precision}", "sana", "sol_rl", f"explore.precision={precision}")))


def _sana(sets: tuple[str, ...], ctx: Context) -> str:
    return _said(_train(_config(ctx, "-".join(sets), "sana", "sol_rl", *sets)))


def _compiled(ctx: Context) -> str:
    return _sana(("explore.compile=true", "sampler.rollout_copy=true", "sampler.compile=true",
                  "optimizer.compile=true"), ctx)


def _reward(ctx: Context) -> str:
    return _said(_train(_config(ctx, "reward", "sana", "sol_rl", reward=ctx.reward)))


def _checkpoint(ctx: Context) -> str:
    """A checkpoint, a resume to the second iteration, and a merged export diffusers loads back."""
    import torch

    from solrl_core.bench.build import transformer_class
    from solrl_core.config.convert import from_dict, load_run_config
    from solrl_core.engine.checkpoint import checkpoint_to_resume

    first = _train(_config(ctx, "checkpoint", "sana", "sol_rl"))
    run_dir = first.run.run_dir
    again = from_dict({"run": {"iterations": 2}}, load_run_config(run_dir), source="selftest").validate()
    _train(again, resume=True)
    checkpoint = checkpoint_to_resume(run_dir)
    if checkpoint.name != "iter_000002":
        raise SolrlError(f"the resumed run's newest checkpoint is {checkpoint.name}, not iter_000002",
                         "see docs/reliability.md on resuming")
    out = ctx.export(again, checkpoint, "trained", ctx.root / "export", True)
    loaded = transformer_class(again.model.loader).from_pretrained(str(out.path), subfolder="transformer")
    base = transformer_class(again.model.loader).from_pretrained(str(_pipeline(ctx, "sana")), subfolder="transformer")
    moved = sum(not torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), base.state_dict().values()))
    if not moved:
        raise SolrlError("the exported transformer equals the base model: the trained LoRA was not merged",
                         "see docs/reliability.md on export")
    return (f"resumed {run_dir.name} to {checkpoint.name}; {out.what} loaded by {type(loaded).__name__}: {moved} "
            f"tensors moved")


def _reward_server(ctx: Context) -> str:
    """`solrl reward-server` on 127.0.0.1 in a thread, asked through the client `remote:URL` runs use."""
    import torch

    from solrl_core.bench.run import REWARD
    from solrl_core.rewards.remote import RemoteReward
    from solrl_core.rewards.server import ServerOptions, prepare

    server, sock, url, _ = prepare(ServerOptions({REWARD: 1.0}, port=0, device=ctx.device))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="solrl-selftest-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        remote = RemoteReward(f"remote:{url}")
        scores = remote(torch.rand(2, 3, 32, 32), ["a red cube", "a blue sphere"])
        if scores.shape != (2,) or not torch.isfinite(scores).all():
            raise SolrlError(f"the reward server answered {scores.tolist()} for 2 images", "see docs/remote-rewards.md")
        return f"{url}: 2 images scored {[round(s, 3) for s in scores.tolist()]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FSDP = ("distributed.strategy=fsdp", "sampler.rollout_copy=true", "distributed.copy_layout=sharded")


def _fsdp_one(ctx: Context) -> str:
    """A 1-process fsdp run with both copies asked sharded, in this process, through torch.distributed
    (NCCL on a GPU, gloo on a CPU): the fsdp plan and process group; with one process nothing is split
    (sharding.layout_of), which the multi-process row does."""
    from solrl_core.runtime import distributed

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        session = _train(_config(ctx, "fsdp", "sana", "sol_rl", *FSDP))
        if session.run.machine.strategy != "fsdp":
            raise SolrlError(f"distributed.strategy=fsdp ran as {session.run.machine.strategy}", "see "
                                                                                                 "docs/distributed.md")
        return f"{_said(session)}: {session.run.layout.describe()}"
    finally:
        distributed._shutdown()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _fsdp_many(ctx: Context) -> str:
    """`solrl train --nproc-per-node 2` with both sharded copies, as a user would start it; the sharded
    layout is read back from the run's events."""
    cfg = _config(ctx, "fsdp-2", "sana", "sol_rl", *FSDP)
    sets = [f"model.path={cfg.model.path}", f"model.resolution={cfg.model.resolution}", *RANDOM, *SMALL,
            "run.iterations=1",
            # a prompt group per process
            f"run.run_dir={cfg.run.run_dir}", "run.prompts_per_iteration=2", *FSDP, *ctx.sets]
    cmd = [sys.executable, "-m", "solrl_cli", "train", "--model", "sana", "--nproc-per-node", "2", "--reward",
           ",".join(cfg.reward.weights)]
    done = subprocess.run([*cmd, *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, timeout=540)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()
        raise SolrlError(f"2-process fsdp run exited {done.returncode}: {' '.join(lines[-2:])}",
                         "run it by hand with SOLRL_DEBUG=1: solrl train --nproc-per-node 2 --set "
                         "distributed.strategy=fsdp")
    events = (Path(cfg.run.run_dir) / EVENTS_FILE).read_text()
    if "fsdp over 2 processes" not in events:
        raise SolrlError("the 2-process fsdp run finished without sharding the policy", "see docs/distributed.md")
    return "2 processes: the policy, explore and rollout copies sharded, 1 iteration"
