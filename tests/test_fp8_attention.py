"""FP8 attention for the explore copy (explore.fp8_attention, precision/fp8_attention.py): the scale
rule by hand, the emulation against SDPA, the swap confined to the explore copy's forwards (eager and
compiled), the refusals, the doctor's row and the rank check with and without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.precision import fp8_attention as fa

runner = CliRunner()
SDPA = F.scaled_dot_product_attention


def test_the_scale_rule_by_hand_one_per_batch_and_head_and_per_group_for_gqa():
    x = torch.zeros(2, 2, 3, 4)
    x[0, 0, 1, 2] = -2.0  # amax 2: scale 448 / 2, descale 2 / 448
    x[1, 0, 0, 0] = 896.0
    x[1, 1] = 1e-13  # amax <= 1e-12: scale and descale 1
    scale, descale = fa.scales(x)
    assert scale.shape == (2, 2, 1, 1) and scale.dtype == torch.float32
    assert scale.flatten().tolist() == [224.0, 1.0, 0.5, 1.0]
    assert torch.equal(descale.flatten(), torch.tensor([2 / 448, 1.0, 2.0, 1.0]))  # amax / 448 in fp32, as torchao's
    codes, _ = fa.quantize(x)
    assert codes.dtype == torch.float8_e4m3fn and codes[0, 0, 1, 2].item() == -448.0 and codes[1, 0, 0,
                                                                                               0].item() == 448.0
    grouped, _ = fa.scales(x.reshape(1, 4, 3, 4), groups=2)  # heads (0, 1) and (2, 3) share a scale
    assert grouped.flatten().tolist() == [224.0, 0.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_emulation_is_sdpa_on_the_e4m3_rounded_inputs_within_a_step_of_them(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g).to(dtype) * s for s in (1.0, 3.0, 0.01))
    for x in (q, k, v):
        _, descale = fa.scales(x)
        err = (fa.fake_quantize(x) - x.float()).abs()
        # half an E4M3 step, normal or subnormal
        bound = torch.maximum(x.float().abs() * 2.0 ** -4, 2.0 ** -10 * descale)
        assert torch.all(err <= bound * (1 + 1e-6)) and err.max() > 0
    out = fa.emulated_sdpa(q, k, v)
    assert out.dtype == dtype
    assert torch.equal(out, SDPA(fa.fake_quantize(q), fa.fake_quantize(k), fa.fake_quantize(v)).to(dtype))
    assert not torch.equal(out, SDPA(q, k, v))
    mask = (torch.arange(16) < 11)[None, None, None, :]  # padded keys masked out, as Qwen-Image and Z-Image pass them
    assert torch.equal(fa.emulated_sdpa(q, k, v, attn_mask=mask),
                       SDPA(fa.fake_quantize(q), fa.fake_quantize(k), fa.fake_quantize(v), attn_mask=mask).to(dtype))


def test_inputs_representable_in_e4m3_at_scale_1_give_sdpa_exactly():
    values = torch.tensor([0.0, 0.5, 1.0, -2.0, 3.5, 0.0625, 240.0, -448.0, 0.001953125])  # all E4M3 values
    g = torch.Generator().manual_seed(1)
    q, k, v = (values[torch.randint(0, len(values), (1, 2, 8, 4), generator=g)] for _ in range(3))
    for x in (q, k, v):
        x[..., 0, 0] = 448.0  # every head's amax is 448: scale exactly 1
    assert torch.equal(fa.scales(q)[0], torch.ones(1, 2, 1, 1))
    assert torch.equal(fa.emulated_sdpa(q / 64, k / 64, v), SDPA(q / 64, k / 64, v))  # a power of two: exact too
    assert torch.equal(fa.emulated_sdpa(q, k, v), SDPA(q, k, v))


def test_the_swap_holds_only_inside_and_compiled_graphs_follow_it():
    class Attend(torch.nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x)

    x = torch.randn(1, 2, 8, 16)
    compiled = torch.compile(Attend(), backend="eager")
    with fa.swapped(fa.emulated_sdpa):
        inside = compiled(x)
    outside = compiled(x)  # the same compiled module: a guard sends it back to SDPA
    assert torch.equal(inside, fa.emulated_sdpa(x, x, x)) and torch.equal(outside, SDPA(x, x, x))
    with pytest.raises(RuntimeError), fa.swapped(fa.emulated_sdpa):
        raise RuntimeError("a forward that fails")
    assert F.scaled_dot_product_attention is SDPA


def _tiny_video(tmp_path: Path, *extra: str):
    from solrl_core.config.presets import resolve_config

    return resolve_config("tiny_video", "sol_rl", sets=["explore.precision=nvfp4-emulated", "run.threads=2",
                                                        f"run.run_dir={tmp_path / 'run'}", *extra])


def test_the_explore_copy_runs_fp8_attention_and_the_trained_model_does_not(tmp_path, monkeypatch):
    from solrl_core.engine.engine import open_engine

    calls: list[int] = []
    real = fa.emulated_sdpa

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fa, "emulated_sdpa", counted)
    engine = open_engine(_tiny_video(tmp_path, "explore.fp8_attention=true"), explore=True)
    copy_ = engine.explore_copy
    assert copy_.fp8_attention and copy_.forward is copy_.module  # the module itself: keys and parameters unchanged
    prompts, seeds = ["a red circle moving right"] * 2, torch.arange(2)
    cond = engine.conditioning(prompts)
    trained = engine.generate(cond, seeds, 2, "rollout").latents  # the policy, its old adapter active
    on = engine.generate(cond, seeds, 2, "explore").latents
    used = len(calls)
    assert used > 0 and F.scaled_dot_product_attention is SDPA
    with copy_.without_fp8_attention():
        off = engine.generate(cond, seeds, 2, "explore").latents
    assert not torch.equal(on, off)
    assert torch.equal(trained, engine.generate(cond, seeds, 2, "rollout").latents)  # after the explore forwards too
    assert len(calls) == used  # neither the copy without it nor the trained model ran the FP8 kernel


def test_refused_on_a_model_without_full_attention_and_beside_a_full_precision_copy(tmp_path):
    run = [sys.executable, "-m", "solrl_cli", "rank-check", "--count", "1", "--seeds", "4", "--hit-k", "1",
           "--fp8-attention", "--out", str(tmp_path / "rc")]
    sana = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert sana.returncode == 2 and "Traceback" not in sana.stderr + sana.stdout
    assert "model.loader=tiny has none (SANA's self-attention is linear)" in sana.stdout + sana.stderr
    full = runner.invoke(app, ["rank-check", "--model", "tiny_video", "--explore-precision", "fp32", "--fp8-attention",
                               "--seeds", "4", "--hit-k", "1", "--out", str(tmp_path / "rc2")])
    assert full.exit_code == 2 and "the explore precision here is fp32" in full.output
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import StopFlag, train

    cfg = resolve_config("tiny", "sol_rl", sets=["explore.fp8_attention=true", f"run.run_dir={tmp_path / 'run'}"])
    with pytest.raises(SolrlError, match="has none"):
        train(cfg, ev.EventBus(), stop=StopFlag())
    assert not (tmp_path / "run").exists()  # refused before anything is written
    scaling = resolve_config("tiny_video", "naive_scaling",
                             sets=["explore.fp8_attention=true", f"run.run_dir={tmp_path / 'run'}"])
    # no explore copy to put it in
    with pytest.raises(SolrlError, match="the explore precision here is fp32") as refused:
        train(scaling, ev.EventBus(), stop=StopFlag())
    assert "sol_rl, naive_quant" in refused.value.fix and not (tmp_path / "run").exists()


def test_refused_on_a_gpu_that_cannot_run_fp8_fa3_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    with pytest.raises(SolrlError, match="torchao's FP8 FA3 runs on Hopper only"):
        fa.require("fp8", "flux1", "cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    real = fa.importlib.util.find_spec
    monkeypatch.setattr(fa.importlib.util, "find_spec",
                        lambda name: None if name == "flash_attn_interface" else real(name))
    with pytest.raises(SolrlError, match=r"cannot run on cuda:0: missing flash-attn's FA3 build") as refused:
        fa.require("fp8", "wan", "cuda:0")
    assert "explore.fp8_attention=false" in refused.value.fix
    monkeypatch.setattr(fa.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    fa.require("fp8", "wan", "cuda:0")  # everything there: no refusal
    with pytest.raises(SolrlError, match="takes no attention mask, and model.loader=qwen_image masks"):
        fa.require("fp8", "qwen_image", "cuda:0")
    fa.require("nvfp4-emulated", "qwen_image", "cpu")  # the emulation takes the mask
    assert fa.backend((9, 0))[0] == "torchao-fa3"


def test_the_doctor_names_the_attention_kernel_per_gpu(monkeypatch):
    from solrl_core.doctor.backends import backends_check, simulated_gpu

    cpu = backends_check(None, "scaled_mm").detail
    assert "on the CPU (no speed figure on a CPU): " in cpu
    assert "fp8 attention -> emulation (torch, Q/K/V rounded to E4M3 then SDPA: numerics only, not fast)" in cpu
    blackwell = backends_check(simulated_gpu("10.0"), "scaled_mm", simulated=True).detail
    assert ((((((((("fp8 attention: not here (compute capability 10.0 is not 9.x: torchao's FP8 FA3 runs on Hopper "
                    "only)" in blackwell)))))))))
    real = fa.importlib.util.find_spec
    monkeypatch.setattr(fa.importlib.util, "find_spec",
                        lambda name: None if name == "flash_attn_interface" else real(name))
    hopper = backends_check(simulated_gpu("9.0"), "scaled_mm", simulated=True).detail
    assert "fp8 attention: not here (missing flash-attn's FA3 build (flash_attn_interface" in hopper
    monkeypatch.setattr(fa.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    hopper = backends_check(simulated_gpu("9.0"), "scaled_mm", simulated=True).detail
    assert (((((((("fp8 attention -> torchao-fa3 (torchao FP8 FA3, per-(batch, head) E4M3 Q/K/V), unmeasured on this "
                   "GPU" in hopper))))))))


def test_rank_check_reports_the_explore_arms_with_and_without_fp8_attention(tmp_path):
    result = runner.invoke(app, ["rank-check", "--model", "tiny_video", "--explore-precision", "nvfp4-emulated",
                                 "--fp8-attention", "--count", "1", "--seeds", "4", "--hit-k", "1", "--preview-steps",
                                 "1",
                                 "--full-steps", "2", "--set", "algorithm.timestep_fraction=0.5", "--out",
                                 str(tmp_path / "rc")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "rc" / "rank_check.json").read_text())
    assert data["arms"] == ["nvfp4-emulated+fp8-attention@1", "nvfp4-emulated+fp8-attention@2", "nvfp4-emulated@1",
                            "nvfp4-emulated@2", "fp32@1", "fp32@2"]
    assert set(data["overall"]) == set(data["arms"][:-1])


def test_the_benchmark_row_times_fp8_attention_only_where_fa3_runs(monkeypatch):
    from solrl_core.bench import explore

    cpu = torch.device("cpu")
    assert "has no full attention" in explore.skip_reason(explore.FP8_ATTENTION, cpu, True, "sana")
    assert explore.skip_reason(explore.FP8_ATTENTION, cpu, True, "flux1").startswith("no GPU: FP8 FA3 needs")
    with explore.attention(explore.FP8_ATTENTION, cpu):  # what its steps are timed under
        assert F.scaled_dot_product_attention is fa.emulated_sdpa
    with explore.attention("fp8", cpu):
        assert F.scaled_dot_product_attention is SDPA
