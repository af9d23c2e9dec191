"""Contradictions refused, or honoured aloud: a preset with a model, family or reward that is not its own;
a reward of weight 0 (every reward 0, or one trained reward 0); `solrl infer` with no prompt says how many
images it will make and how far it has got; a preset cut short is recognised by its beginning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EVAL_SMALL

ROOT = Path(__file__).resolve().parents[1]


def solrl(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("SOLRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "solrl_cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--preset", "tiny_sol_rl_tinyworld_geneval", "--model", "tiny_video"],
     "preset tiny_sol_rl_tinyworld_geneval names model tiny, and model tiny_video was given too"),
    (["--preset", "tiny_sol_rl_tinyworld_geneval", "--family", "naive_scaling"], "names family sol_rl, and family "
                                                                                 "naive_scaling"),
    (["--preset", "tiny_sol_rl_tinyworld_geneval", "--reward", "jpeg_compressibility"],
     "names reward tinyworld_geneval, and reward jpeg_compressibility"),
    (["--reward", "tinyworld_geneval=0"], "every reward has weight 0 (tinyworld_geneval=0)"),
    (["--reward", "tinyworld_geneval=1,jpeg_compressibility=0"], "reward jpeg_compressibility has weight 0: training"),
])
def test_a_contradiction_or_a_reward_of_weight_0_is_refused_before_training(tmp_path, args, message):
    proc = solrl(tmp_path, "train", *args, "--iterations", "1")
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_preset_given_with_its_own_parts_is_accepted(tmp_path):
    proc = solrl(tmp_path, "train", "--preset", "tiny_sol_rl_tinyworld_geneval", "--model", "tiny", "--dump-config")
    assert proc.returncode == 0 and "tiny_sol_rl_tinyworld_geneval" in proc.stdout, proc.stdout + proc.stderr


def test_a_preset_cut_short_is_suggested_by_its_beginning(tmp_path):
    proc = solrl(tmp_path, "train", "--preset", "tiny_sol_rl_jpeg", "--dump-config")
    assert proc.returncode == 2 and "did you mean 'tiny_sol_rl_jpeg_compressibility'" in proc.stdout + proc.stderr


def test_infer_without_a_prompt_says_how_many_images_and_how_far_it_got(tmp_path):
    from solrl_core.data.prompts import load_prompts

    proc = solrl(tmp_path, "infer", "--set", f"run.eval_prompts={EVAL_SMALL}", "--set", "sampler.rollout_batch=2",
                 "--seeds", "2", "--steps", "2", "--out", "out")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    images = 2 * len(load_prompts(str(EVAL_SMALL)))
    assert f"weights base: {images} images" in out and f"prompts: {EVAL_SMALL} (no --prompt given" in out, out
    assert f"  base weights: {images // 4}/{images} images (25%)" in out, out  # a line at each quarter, as it goes


def test_a_long_launch_note_waits_until_the_launcher_flags_are_checked(tmp_path):
    proc = solrl(tmp_path, "train", "--nnodes", "2")
    assert proc.returncode == 2 and "note:" not in proc.stdout, proc.stdout
    assert (proc.stdout + proc.stderr).lstrip().startswith("error: --nnodes 2 needs --rdzv-endpoint")


def _rank_check(seconds: dict[str, float], ranked: str):
    """Four arms over 3 prompts x 8 seeds; `ranked` orders its seeds as the reference does, the other reversed."""
    import numpy as np

    from solrl_core.loop.fidelity import Arm, compare_arms

    arms = [Arm("nvfp4-emulated@6", "explore", 6), Arm("nvfp4-emulated@10", "explore", 10), Arm("fp32@6", "rollout", 6),
            Arm("fp32@10", "rollout", 10)]
    reference = np.tile(np.linspace(0, 1, 8), (3, 1))
    rewards = {a.name: reference if a.name in (ranked, "fp32@10") else reference[:, ::-1].copy() for a in arms}
    return compare_arms(arms, rewards, seconds, ["a", "b", "c"], np.arange(24).reshape(3, 8), [2], 4)


def test_rank_check_ends_with_a_verdict_for_this_machine():
    from solrl_core.loop.rankcheck import verdict

    slow_emulation = {"nvfp4-emulated@6": 91.0, "nvfp4-emulated@10": 120.0, "fp32@6": 66.5, "fp32@10": 90.0}
    said = verdict(_rank_check(slow_emulation, "fp32@6"))
    assert said.startswith("use --explore-precision fp32 on this machine: it ranks as well or better in less time")
    assert "91.0s vs 66.5s" in said
    fast_low = {"nvfp4-emulated@6": 10.0, "nvfp4-emulated@10": 15.0, "fp32@6": 20.0, "fp32@10": 30.0}
    assert verdict(_rank_check(fast_low, "nvfp4-emulated@6")).startswith("keep nvfp4-emulated: it ranks as well or "
                                                                         "better")
    assert verdict(_rank_check(fast_low, "fp32@6")).startswith("keep nvfp4-emulated for speed (10.0s vs 20.0s)")
