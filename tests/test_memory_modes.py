"""Memory modes for one tight GPU (memory_modes.py, offload.py): each gives the run no mode gives, a
checkpoint written under one resumes under another, the
estimate's arithmetic per mode, the doctor's table per GPU size, and the refusal of a GPU too small for
every mode before any weights load. On a CPU the moves are no-ops (the run device is the CPU): these
tests check the runs and the arithmetic, not GPU bytes."""

import dataclasses

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.plan.footprint import BLOCK_SHARE, MemoryEstimate, estimate_memory
from solrl_core.plan.memory_modes import GPU_SIZES, LADDER, choose_modes, rung_needed, smallest_gpu
from solrl_core.plan.plan import MemoryModes
from solrl_core.precision.hardware import GpuInfo
from tests.helpers import train_recording

MODES = {"copies-whole": ("memory.copies=cpu-whole",), "copies-blocks": ("memory.copies=cpu-blocks",),
         "checkpointing": ("optimizer.checkpointing=true",), "vae": ("memory.vae_on_cpu=true",)}


_run = train_recording  # (session, events) of a tiny sol_rl run, optionally stopped after an iteration


def _outcome(session, seen):
    its = [e for e in seen if isinstance(e, ev.IterationFinished)]
    return ([(e.final.mean, e.draft.mean, e.loss["loss"], e.loss["kl"]) for e in its],
            {w: session.run.engine.policy.state(w) for w in ("default", "old", "ema")})


def _assert_same(a, b, atol):
    (rows_a, adapters_a), (rows_b, adapters_b) = a, b
    assert len(rows_a) == len(rows_b)
    for ra, rb in zip(rows_a, rows_b):
        assert ra == pytest.approx(rb, abs=atol)
    for which in adapters_a:
        assert all(torch.allclose(adapters_a[which][k], adapters_b[which][k], atol=atol)
                   for k in adapters_a[which]), which


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """Two iterations with no memory mode (the CPU's auto)."""
    from tests.conftest import FAST

    root = tmp_path_factory.mktemp("baseline")
    return _outcome(*_run([*FAST, "run.iterations=2", f"run.run_dir={root}"]))


@pytest.mark.parametrize("mode", list(MODES))
def test_each_memory_mode_gives_the_run_no_mode_gives(mode, baseline, fast_sets):
    session, seen = _run(fast_sets("run.iterations=2", *MODES[mode]))
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    chosen = session.run.machine.memory
    assert f"memory mode {chosen.describe()}" in started.machine  # the start-up line names the mode
    assert chosen != MemoryModes() and chosen.describe() != "none"
    parking = session.run.engine.parking
    assert (parking is not None) == mode.startswith("copies")  # the tiny model has no VAE to park
    _assert_same(_outcome(session, seen), baseline, atol=1e-6)


@pytest.mark.parametrize("first,second", [(("memory.copies=cpu-blocks",), ("memory.copies=cpu-whole",
                                                                           "optimizer.checkpointing=true")),
                                          (("optimizer.checkpointing=true",), ("memory.copies=cpu-blocks",))])
def test_a_checkpoint_resumes_under_another_mode(first, second, baseline, fast_sets):
    # no mode changes a number or the optimizer (AdamW, fp32 moments), so the resumed run is the uninterrupted one
    _run(fast_sets("run.iterations=2", *first, run_dir="b"), stop_after=1)
    resumed, seen = _run(fast_sets("run.iterations=2", *second, run_dir="b"), resume=True)
    assert [e.iteration for e in seen if isinstance(e, ev.IterationFinished)] == [2]
    assert resumed.run.machine.memory == MemoryModes(copies=second[0].split("=")[1],
                                                     checkpointing="optimizer.checkpointing=true" in second)
    rows, adapters = _outcome(resumed, seen)
    _assert_same((rows, adapters), (baseline[0][1:], baseline[1]), atol=1e-6)


# --- the estimate's arithmetic ---------------------------------------------------------------------

def test_each_modes_bytes_in_the_peak():
    est = MemoryEstimate(policy=10, explore_copy=5, vae=1, text_encoders=4, activations=6, overhead=1, rollout_copy=8,
                         optimizer=0.5)
    none = dataclasses.replace(est, modes=MemoryModes())
    assert none.peak == 10 + 5 + 8 + 1 + 0.5 + 1 + max(4, 6)
    vae = dataclasses.replace(est, modes=MemoryModes(vae_on_cpu=True))
    assert vae.peak == 10 + 5 + 8 + 0.5 + 1 + max(4, 6, 1)  # the VAE comes in to decode only
    whole = dataclasses.replace(est, modes=MemoryModes(copies="cpu-whole"))
    assert whole.peak == 10 + 1 + 0.5 + 1 + max(4, 6 + 8, 5, 8)  # v_old's copy beside the activations
    blocks = dataclasses.replace(est, modes=MemoryModes(copies="cpu-blocks", vae_on_cpu=True))
    assert blocks.peak == pytest.approx(10 + 0.5 + 1
                                        + max(4, 6 + 8 * BLOCK_SHARE, 5 * BLOCK_SHARE + 1, 8 * BLOCK_SHARE + 1))


# --- choosing, the doctor, the refusal -----------------------------------------------------------

def test_auto_takes_the_first_rung_that_fits_and_an_explicit_setting_holds():
    cfg = resolve_config("flux1", "sol_rl")
    whole, blocks = (estimate_memory(cfg, "fp8", "bf16", modes=rung).peak for rung in LADDER[-2:])
    assert blocks < whole
    budget = (whole + blocks) / 2  # only the last rung fits
    choice = choose_modes(cfg, "fp8", "bf16", budget)
    assert choice.fits and choice.modes == LADDER[-1] and choice.peak == pytest.approx(blocks)
    assert choose_modes(cfg, "fp8", "bf16", whole).modes == LADDER[-2]  # the first rung that fits, not a later one
    forced = dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, copies="cpu-whole"))
    assert not choose_modes(forced, "fp8", "bf16", budget).fits  # never block by block when told whole
    assert choose_modes(cfg, "fp8", "bf16", None).modes == MemoryModes()  # a CPU: auto is off


@pytest.mark.parametrize("model", ["flux1", "sana", "qwen_image"])
def test_the_doctor_table_names_the_first_rung_that_fits_each_size(model):
    from solrl_core.doctor.modes import mode_table, modes_check

    cfg = resolve_config(model, "sol_rl")
    for gb, rung in mode_table([model])[model].items():
        fits = [estimate_memory(cfg, "fp8", "bf16", modes=r).peak <= gb * 0.9 for r in LADDER]
        assert rung == (LADDER[fits.index(True)] if any(fits) else None)
    detail = modes_check(cfg).detail
    assert "ESTIMATE" in detail and f"{model}: 24 GB: " in detail and all(f"{gb} GB" in detail for gb in GPU_SIZES)


def test_a_gpu_too_small_for_every_mode_is_refused_before_weights_load(fast_sets, monkeypatch):
    import solrl_core.loop.session as session
    import solrl_core.plan.resolve as resolve

    small = GpuInfo(0, "small GPU", (9, 0), 24.0)
    monkeypatch.setattr(resolve, "gpu_of", lambda device: small)
    monkeypatch.setattr(session, "gpu_of", lambda device: small)
    monkeypatch.setattr(session, "open_engine", lambda *a, **k: pytest.fail("weights loaded"))
    cfg = resolve_config("flux1", "sol_rl", "jpeg_compressibility",
                         sets=[*fast_sets(), "run.device=cpu", "run.dtype=bf16", "run.prompts=tiny",
                               "run.eval_prompts=",
                               "model.path=", "explore.precision=bf16"])
    assert rung_needed(cfg, "bf16", "bf16", 24) is None
    with pytest.raises(SolrlError) as err:
        train(cfg, ev.EventBus(), stop=StopFlag())
    assert "in any memory mode" in err.value.message and "ESTIMATE" in err.value.message
    assert f"{smallest_gpu(cfg, 'bf16', 'bf16')} GB" in err.value.fix


def test_vae_on_cpu_decodes_the_same_images(tmp_path):
    pytest.importorskip("diffusers")
    from solrl_core.engine.engine import open_engine
    from tests.tiny_pipelines import save_tiny_pipeline

    folder = save_tiny_pipeline("sana", tmp_path / "sana")
    cfg = resolve_config("sana", "sol_rl", "jpeg_compressibility",
                         sets=["model.resolution=32", "model.lora_rank=4", "model.lora_alpha=8",
                               "sampler.rollout_batch=2",
                               "run.device=cpu", f"model.path={folder}", "run.threads=2"])
    seeds = torch.tensor([1, 2])
    images = [open_engine(cfg, memory=memory).images(["a cat", "a dog"], seeds, 2, "base")
              for memory in (None, MemoryModes(vae_on_cpu=True))]
    assert torch.equal(images[0], images[1])
    engine = open_engine(cfg, memory=MemoryModes(vae_on_cpu=True))
    assert engine.parking is not None and engine.parking.vae is engine.model.vae
