"""What several test modules share: tiny runs that record their events (and stop after an iteration),
multi-process runs, run folders and real `solrl` processes, made-up events for the TUI, console capture,
and tiny reward and model folders. A test module imports these from here (or conftest.py, serving.py,
screens.py),
never from another test module: tests/test_structure.py checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import Config
from solrl_core.data.tinyworld import example
from solrl_core.errors import SolrlError
from solrl_core.faults.manifest import write_manifest
from solrl_core.loop.trainer import StopFlag, train
from tests.conftest import FAST
from tests.serving import free_port

ROOT = Path(__file__).resolve().parents[1]


# ---- Tiny runs in this process ---------------------------------------------------------------------------


def stop_flag_after(bus: ev.EventBus, iteration: int | None) -> StopFlag:
    """A stop flag that asks the run on `bus` to stop once iteration `iteration` has finished, as a first
    Ctrl-C would (it saves a checkpoint and returns); None: a flag never asked."""
    flag = StopFlag()
    if iteration is not None:
        bus.subscribe(lambda e: setattr(flag, "requested", True)
                      if isinstance(e, ev.IterationFinished) and e.iteration == iteration else None)
    return flag


def train_recording(sets, family="sol_rl", resume=False, stop_after=None, checkpoint=None,
                    seen=None):  # type: ignore[no-untyped-def]
    """A tiny `family` run with the `sets` overrides, stopped after iteration `stop_after` if given:
    (its session, every event it published, also appended to `seen`)."""
    bus, seen = ev.EventBus(), [] if seen is None else seen
    bus.subscribe(seen.append)
    flag = stop_flag_after(bus, stop_after)
    session = train(resolve_config("tiny", family, sets=sets), bus, resume=resume, stop=flag, checkpoint=checkpoint)
    return session, seen


def train_or_error(sets, resume=False, checkpoint=None, stop_after=None):  # type: ignore[no-untyped-def]
    """As train_recording, with the SolrlError raised in place of the session."""
    seen: list[ev.Event] = []
    try:
        return train_recording(sets, resume=resume, stop_after=stop_after, checkpoint=checkpoint, seen=seen)
    except SolrlError as exc:
        return exc, seen


def of_kind(seen, kind):  # type: ignore[no-untyped-def]
    """The events of `kind` among `seen`."""
    return [e for e in seen if isinstance(e, kind)]


def record_events(run_dir, family, rewards, seconds, resume_at=None):
    """A run's events: start, base eval, one iteration per reward, a final eval; optionally a stop
    after iteration `resume_at`'s checkpoint, one more iteration logged, and a resume."""
    log = ev.JsonlLog(run_dir / "events.jsonl")
    start = dict(run_dir=str(run_dir), preset=f"tiny_{family}", device="cpu", dtype="fp32", explore_precision="fp32",
                 plan="", iterations=len(rewards), config={"algorithm": {"family": family}})
    log(ev.RunStarted(start_iteration=0, resumed=False, **start))
    log(ev.EvalFinished(iteration=0, weights="base", prompts="p", samples=4, mean=0.5, components={}, extras={},
                        seconds=2.0))

    def iteration(i, reward):
        stats = ev.RewardStats(mean=reward, std=0.1, best=reward + 0.2, worst=reward - 0.2, components={})
        phases = {**dict.fromkeys(ev.PHASES, 0.0), "explore": seconds / 2, "train": seconds / 2, "total": seconds}
        log(ev.IterationFinished(iteration=i, iterations=len(rewards), seconds=phases, draft=None, final=stats,
                                 loss={"loss": 1.0, "policy": 1.0, "kl": 0.0}, nonfinite_losses=0, grad_norm=0.1,
                                 old_decay=0.0))

    for i, reward in enumerate(rewards, 1):
        iteration(i, reward)
        if i == resume_at:
            iteration(i + 1, 99.0)  # logged, then lost to a crash before its checkpoint
            log(ev.RunStarted(start_iteration=i, resumed=True, **start))
    log(ev.EvalFinished(iteration=len(rewards), weights="ema", prompts="p", samples=4, mean=0.7, components={},
                        extras={}, seconds=2.0))
    log.close()


# ---- Several processes -----------------------------------------------------------------------------------


# Rollout and micro-batches of 4: one rank (8 Stage-2 samples) and two (4 each) batch alike, so
# only the gradient all-reduce's summation order can differ.
DISTRIBUTED_SETS = (*FAST, "run.threads=1", "sampler.rollout_batch=4", "optimizer.micro_batch=4", "run.eval_seeds=1")


def spawn(world: int, root: Path, limit: float = 240.0, *, worker) -> None:  # type: ignore[no-untyped-def]
    """`worker(rank, world, port, root)` (a test module's function) on `world` processes; a run that does
    not finish in `limit` seconds (a rank waiting in a collective another never joins) fails the test."""
    ctx = mp.spawn(worker, args=(world, free_port(), root), nprocs=world, join=False)
    deadline = time.monotonic() + limit
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.terminate()
            pytest.fail(f"the {world}-rank run did not finish in {limit:.0f}s")


def logged_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def saved_adapters(run_dir: Path, iteration: int) -> dict[str, torch.Tensor]:
    ckpt = run_dir / "checkpoints" / f"iter_{iteration:06d}"
    return {f"{sub}/{k}": v for sub in ("", "old", "ema")
            for k, v in load_file(str(ckpt / sub / "pytorch_lora_weights.safetensors")).items()}


# As DISTRIBUTED_SETS, with Stage 1 at the run dtype and no rollout copy: what fsdp runs
# (sharding.py), so the 1-process replicated run computes the same iteration.
FSDP_SETS = (*FAST, "run.threads=1", "sampler.rollout_batch=4", "optimizer.micro_batch=4", "run.eval_seeds=1",
             "explore.precision=fp32", "sampler.rollout_copy=false")


# Only the order of the gradient sum differs between the layouts (the rewards, selections and losses
# are equal: each test compares them). Adam divides each gradient by its own running RMS, so the
# rounding of a near-zero gradient element can move that element by a fair part of one step (lr):
# 3.3e-5 was measured on a lora_B element after 3 iterations of the 2x2 mesh (torch 2.14.1, 2-core CPU).
ADAM_ROUNDING = 0.25 * 3e-4  # a quarter of a step at optimizer.lr's default


def assert_adapters_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=ADAM_ROUNDING), (k, (a[k] - b[k]).abs().max().item())


def run_two_nodes(run_dir: Path, sets: list[str], timeout: float) -> None:
    """`solrl train` launched twice with --nnodes 2 on this machine, 2 processes each (a replicate 2 x
    shard 2 mesh under fsdp), both launchers required to succeed."""
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "solrl_cli", "train", "--nproc-per-node", "2", "--nnodes", "2",
                               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "--run-dir", str(run_dir), *sets], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) for node in (0, 1)]
    try:
        outputs = [n.communicate(timeout=timeout)[0] for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    assert [n.returncode for n in nodes] == [0, 0], outputs


def explore_sets(precision: str, *extra: str) -> list[str]:
    """FSDP_SETS (no rollout copy, as fsdp), exploring at `precision`, the rank check every
    iteration, no evaluation."""
    return [*(s for s in FSDP_SETS if not s.startswith("explore.precision=")), f"explore.precision={precision}",
            "run.iterations=2", "explore.rank_check_every=1", "run.eval_prompts=", *extra]


def explore_config(root: Path, run: str, strategy: str, precision: str, *extra: str, family: str = "sol_rl") -> Config:
    return resolve_config("tiny", family, sets=explore_sets(precision, *extra, f"run.run_dir={root / run}",
                                                       f"distributed.strategy={strategy}"))


def train_recording_kept(cfg: Config, out: Path) -> None:
    """Train `cfg`, writing the seeds each iteration kept (this rank's) to `out`."""
    import solrl_core.loop.trainer as trainer

    real, kept = trainer.select_seeds, []

    def select(run, drafts, rng):  # type: ignore[no-untyped-def]
        index = real(run, drafts, rng)
        kept.append(drafts.batch.seeds[index].tolist())
        return index

    trainer.select_seeds = select
    try:
        train(cfg, ev.EventBus(), stop=StopFlag())
    finally:
        trainer.select_seeds = real
    out.write_text(json.dumps(kept))


def copy_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the copy computes with: its buffers (the quantized caches among them) and the
    parameters it holds (not on the meta device)."""
    out = {k: v.clone() for k, v in module.named_buffers()}
    out.update({k: v.detach().clone() for k, v in module.named_parameters() if not v.is_meta})
    return out


def copy_tensors_equal(sharded: dict[str, torch.Tensor], replica: dict[str, torch.Tensor]) -> bool:
    """The sharded copy's tensors equal the replica copy's of the same name (the replica also holds
    its quantized layers' high-precision weights, which the sharded one never has)."""
    assert set(sharded) <= set(replica), set(sharded) - set(replica)
    return all(torch.equal(v, replica[k]) for k, v in sharded.items())


def same_iterations(one: Path, two: Path) -> list[tuple[dict, dict]]:
    """The two iterations of run `two` against run `one`'s: equal draft mean and best, final mean and
    loss. Returns the pairs of iteration events for further checks."""
    its = [[e for e in logged_events(d) if e["event"] == "iteration"] for d in (one, two)]
    assert len(its[1]) == 2
    for a, b in zip(*its):
        assert b["draft"]["mean"] == pytest.approx(a["draft"]["mean"], abs=1e-6)
        assert b["draft"]["best"] == pytest.approx(a["draft"]["best"], abs=1e-6)
        assert b["final"]["mean"] == pytest.approx(a["final"]["mean"], abs=1e-6)
        assert b["loss"]["loss"] == pytest.approx(a["loss"]["loss"], rel=1e-4)
    return list(zip(*its))


def mesh_equals_one_process(tmp_path, precision: str, *extra: str) -> dict:
    """Two launcher invocations with --nnodes 2 on this machine, 2 processes each (a replicate 2 x
    shard 2 mesh), exploring at `precision` with the rank check on, against a 1-process run: equal
    draft and final rewards, both rank checks, equal adapters. Returns the mesh run's first event."""
    train(explore_config(tmp_path, "one", "replicate", precision, "run.prompts_per_iteration=4"), ev.EventBus(),
          stop=StopFlag())
    sets = [a for s in explore_sets(precision, "run.prompts_per_iteration=4", "distributed.strategy=fsdp",
                                    *extra) for a in ("--set", s)]
    run_two_nodes(tmp_path / "mesh", sets, timeout=500)
    started = logged_events(tmp_path / "mesh")[0]
    assert "fsdp over 4 processes (mesh replicate 2 x shard 2" in started["plan"]
    its = [[e for e in logged_events(d) if e["event"] == "iteration"] for d in (tmp_path / "one", tmp_path / "mesh")]
    assert len(its[1]) == 2
    for a, b in zip(*its):
        assert b["draft"]["mean"] == pytest.approx(a["draft"]["mean"], abs=1e-6)
        assert b["final"]["mean"] == pytest.approx(a["final"]["mean"], abs=1e-6)
    assert len([e for e in logged_events(tmp_path / "mesh") if e["event"] == "rank_check"]) == 2
    assert_adapters_close(saved_adapters(tmp_path / "one", 2), saved_adapters(tmp_path / "mesh", 2))
    return started


def kept_rollouts(run, prompts):
    """Stage 2's rollouts of one iteration's kept seeds."""
    from solrl_core.loop.loop_state import LoopState
    from solrl_core.loop.stages import explore, regenerate, score_drafts, select_seeds

    rng = np.random.default_rng(0)
    drafts = explore(run, prompts, rng)
    return regenerate(run, drafts.subset(select_seeds(run, score_drafts(run, LoopState(), ev.EventBus(), drafts), rng)))


def update(run, batch, rng):
    """One update on `batch` as the loop makes it (scored, advantages over the batch)."""
    from solrl_core.loop.loop_state import LoopState
    from solrl_core.loop.stages import score_finals
    from solrl_core.loop.stages import train as update_on

    return update_on(run, score_finals(run, LoopState(), ev.EventBus(), batch), rng)


def perturb(policy, seed: int) -> None:
    """Give both adapters distinct non-zero weights, so v, v_old and v_ref all differ."""
    from solrl_core.engine.policy import OLD, TRAINED

    g = torch.Generator().manual_seed(seed)
    for name in (TRAINED, OLD):
        state = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in policy.state(name).items()}
        policy.load_state(name, state)


# ---- Run folders and real `solrl` processes --------------------------------------------------------------


CKPT = ("checkpoints", "iter_000001")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Each test of a module that imports this runs in its own folder, without SOLRL_DEBUG."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    return tmp_path


def train_cli(*extra: str):  # type: ignore[no-untyped-def]
    """`solrl train` on the tiny settings (CliRunner, in this process), without evaluation; it must succeed."""
    from typer.testing import CliRunner

    from solrl_cli.app import app

    args = [a for s in (*FAST, "run.eval_prompts=") for a in ("--set", s)]  # no evaluation: a checkpoint is all we need
    result = CliRunner().invoke(app, ["train", *args, *extra])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One trained run (lora rank 8, a checkpoint at iteration 1) that each test copies."""
    home = tmp_path_factory.mktemp("trained")
    cwd = os.getcwd()
    os.chdir(home)
    try:
        train_cli("--iterations", "1", "--run-dir", "r", "--set", "model.lora_rank=8")
    finally:
        os.chdir(cwd)
    return home / "r"


def copy_run(trained, to):  # type: ignore[no-untyped-def]
    shutil.copytree(trained, to)
    return to


ENV = {k: v for k, v in os.environ.items() if k != "SOLRL_DEBUG"}


def solrl_process(cwd: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess:
    """A real `solrl` process (`code`: a -c script that runs the CLI itself)."""
    head = ["-c", code] if code else ["-m", "solrl_cli"]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, timeout=300, env=ENV, cwd=cwd)


def assert_refused(done: subprocess.CompletedProcess, *expected: str) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "internal error" not in out and "Traceback" not in out, out[-3000:]
    assert out.count("error:") == 1 and all(e in out for e in expected), out[-3000:]


def file_tree(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def rewrite_state(folder: Path, **values) -> None:
    """trainer_state.json with `values`, the manifest rewritten to match, as anyone who can write the folder can."""
    state = json.loads((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**state, **values}))
    write_manifest(folder)


# A tiny run's checkpoint takes 2.2 MB (measured: tiny model, FAST settings): 3 MiB holds the run
# folder and one checkpoint, not a second one (both exist until the older is pruned).
TMPFS_SIZE = "3m"


def in_tmpfs(mount: Path, script: str, size: str = TMPFS_SIZE, timeout: int = 600) -> subprocess.CompletedProcess:
    """`script` (sh) in a user namespace where `mount` is a fresh tmpfs of `size`; skips where not allowed."""
    mount.mkdir(exist_ok=True)
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: a real small filesystem cannot be mounted here")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mount}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -rm + mount tmpfs refused here: {probe.stderr.decode().strip()[:120]}")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(mount.parent), "COLUMNS": "400"}
    return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {mount} && {script}"],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


# ---- Rewards and real models -----------------------------------------------------------------------------


def noisy_world(count=24, seed=0):
    """Tiny-world captions and their images, blurred by noise so that scores vary (not all 1.0)."""
    pairs = [example(s) for s in range(count)]
    images = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255 for _, img in pairs])
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed))
    return [p for p, _ in pairs], (images + 0.12 * noise).clamp(0, 1)


def tiny_tokenizer():  # type: ignore[no-untyped-def]
    """Byte-level CLIP BPE with no merges: every byte, and every byte ending a word."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        vocab.update({c + suffix: len(vocab) + i for i, c in enumerate(sorted(ByteLevel.alphabet()))})
    return CLIPTokenizer(vocab=vocab, merges=[])


def tiny_image_processor(cls: type | None = None):  # type: ignore[no-untyped-def]
    """A CLIP image processor (`cls`, default transformers' CLIPImageProcessor) for 32x32 images."""
    from transformers import CLIPImageProcessor

    return (cls or CLIPImageProcessor)(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    """A random CLIPModel and its processor, saved as one folder (the layout reward.paths expects)."""
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor

    folder = tmp_path_factory.mktemp("clip")
    tokenizer = tiny_tokenizer()
    config = CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         vocab_size=len(tokenizer), max_position_embeddings=77,
                         bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                           image_size=32, patch_size=16),
        projection_dim=16)
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=tiny_image_processor(), tokenizer=tokenizer).save_pretrained(folder)
    return folder


REAL_FAST = ("model.resolution=32", "model.lora_rank=4", "model.lora_alpha=8", "explore.group_size=4",
             "selection.group_size=2", "explore.steps=1", "sampler.steps=2", "sampler.eval_steps=2",
             "run.prompts_per_iteration=1", "run.iterations=1", "sampler.rollout_batch=4", "optimizer.micro_batch=2",
             "algorithm.timestep_fraction=0.5", "run.threads=2", "run.device=cpu", "run.prompts=tiny",
             "run.eval_prompts=")  # no evaluation: the presets' pickscore_test would need a download


def diffusers_pipeline(name: str, folder):  # type: ignore[no-untyped-def]
    """diffusers' own pipeline on the same folder, with a plain (unshifted) Euler flow scheduler."""
    from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler

    pipe = DiffusionPipeline.from_pretrained(str(folder))
    pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    return pipe


WAN_NAME = "wan21_t2v_1_3b"


WAN_FAST = ("model.resolution=32", "model.lora_rank=4", "model.lora_alpha=8", "explore.group_size=4",
            "selection.group_size=2", "explore.steps=1", "sampler.steps=2", "sampler.eval_steps=2",
            "run.prompts_per_iteration=1", "run.iterations=1", "sampler.rollout_batch=4", "optimizer.micro_batch=2",
            "algorithm.timestep_fraction=0.5", "run.threads=2", "run.device=cpu", "run.prompts=tiny",
            "run.eval_prompts=tiny", "run.eval_rewards=jpeg_incompressibility", "model.quant_min_dim=0")
