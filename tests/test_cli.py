"""The command line: clear one-line errors, nothing written on bad input, and a working default."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app
from tests.conftest import FAST

runner = CliRunner()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    return tmp_path


def _fast_args(*extra):
    args = []
    for s in FAST:
        args += ["--set", s]
    return [*args, *extra]


@pytest.mark.parametrize("args,message", [
    (["--model", "tinny"], "did you mean 'tiny'"),
    (["--family", "sol-rl"], "did you mean 'sol_rl'"),
    (["--reward", "jpeg_compress"], "did you mean 'jpeg_compressibility'"),
    (["--set", "selection.group_size=64"], "more than the N=16"),
    (["--set", "selection.group_size=7"], "even number"),
    (["--set", "explore.steps=11"], "preview steps"),
    (["--set", "explore.groupsize=8"], "did you mean 'group_size'"),
    (["--set", "optimizer.lr=high"], "must be a number"),
    (["--prompts", "missing.txt"], "does not exist"),
    (["--resume", "nowhere"], "does not exist"),
    (["--config", "nope.toml"], "does not exist"),
    (["--explore-precision", "nvfp4"], "use --explore-precision nvfp4-emulated"),
    (["--explore-precision", "fp4"], "unknown explore.precision"),
])
def test_bad_input_is_one_clear_line_and_writes_nothing(args, message, in_tmp):
    result = runner.invoke(app, ["train", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "error:" in result.output and "fix:" in result.output
    assert "Traceback" not in result.output
    assert not (in_tmp / "runs").exists()


def test_bad_prompt_file_names_the_line(in_tmp):
    (in_tmp / "p.jsonl").write_text('{"prompt": "a red circle"}\n{"text": "no prompt key"}\n')
    result = runner.invoke(app, ["train", "--prompts", "p.jsonl"])
    assert result.exit_code == 2 and "line 2" in result.output
    assert not (in_tmp / "runs").exists()


def test_resume_of_a_folder_that_is_not_a_run(in_tmp):
    (in_tmp / "somedir").mkdir()
    result = runner.invoke(app, ["train", "--resume", "somedir"])
    assert result.exit_code == 2 and "not a solrl run directory" in result.output


def test_resume_of_a_corrupt_checkpoint(in_tmp):
    ok = runner.invoke(app, ["train", *_fast_args("--iterations", "1", "--run-dir", "r")])
    assert ok.exit_code == 0, ok.output
    ckpt = in_tmp / "r" / "checkpoints" / "iter_000001"
    (ckpt / "optimizer.safetensors").write_bytes(b"not a safetensors file")
    result = runner.invoke(app, ["train", "--resume", "r", "--iterations", "2"])
    assert result.exit_code == 2 and "corrupt" in result.output and "iter_000001" in result.output
    assert "optimizer.safetensors: truncated or overwritten" in result.output  # the manifest names the file
    missing = runner.invoke(app, ["train", "--resume", "r", "--checkpoint", "iter_000009"])
    assert missing.exit_code == 2 and "no checkpoint 'iter_000009'" in missing.output


def test_debug_env_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("SOLRL_DEBUG", "1")
    result = runner.invoke(app, ["train", "--model", "tinny"])
    assert result.exit_code != 0 and result.exception is not None


def test_dump_config_prints_resolved_toml_and_writes_nothing(in_tmp):
    import tomllib

    result = runner.invoke(app, ["train", "--family", "naive_scaling", "--set", "optimizer.lr=0.001", "--dump-config"])
    assert result.exit_code == 0
    data = tomllib.loads(result.output)
    assert data["preset"] == "tiny_naive_scaling_tinyworld_geneval"
    assert data["optimizer"]["lr"] == 0.001 and data["algorithm"]["family"] == "naive_scaling"
    assert not (in_tmp / "runs").exists()


def test_train_help_shows_how_to_skip_the_evaluations_and_the_flag_does(in_tmp):
    import tomllib

    shown = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    assert "--no-eval" in shown.output and "run.eval_prompts=" in shown.output
    assert tomllib.loads(runner.invoke(app, ["train",
                                             "--dump-config"]).output)["run"]["eval_prompts"] == "tinyworld_eval"
    skipped = runner.invoke(app, ["train", "--no-eval", "--dump-config"])
    assert skipped.exit_code == 0 and tomllib.loads(skipped.output)["run"]["eval_prompts"] == ""


def test_presets_listing_shows_every_kind():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("tiny", "tiny_random", "tiny_video", "tinyworld_geneval", "tinyvideo_geneval", "tinyworld_heldout",
            "tinyvideo_heldout", "sana", "flux1", "sd3", "sd35_medium", "qwen_image", "zimage", "flux2_klein",
                 "wan21_t2v_1_3b", "wan21_t2v_14b", "wan22_ti2v_5b", "sol_rl", "naive_scaling", "compile",
                 "naive_quant", "diffusionnft",
                 "jpeg_compressibility", "jpeg_incompressibility", "general"):
        assert name in result.output


def test_missing_real_model_weights_offline_are_one_line_before_any_run_dir(monkeypatch, in_tmp):
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(in_tmp / "hub"))
    result = runner.invoke(app, ["train", "--model", "flux1"])
    assert result.exit_code == 2, result.output
    assert ("black-forest-labs/FLUX.1-dev" in result.output and "--model-path" in result.output
            and "HF_TOKEN" in result.output)
    assert not Path("runs").exists()


def test_train_writes_a_run_and_resume_extends_it(in_tmp):
    result = runner.invoke(app, ["train", *_fast_args("--iterations", "2", "--run-dir", "r")])
    assert result.exit_code == 0, result.output
    assert "mean Stage-2 reward: first iteration" in result.output
    run = in_tmp / "r"
    assert {"config.toml", "events.jsonl", "checkpoints"} <= {p.name for p in run.iterdir()}
    again = runner.invoke(app, ["train", "--run-dir", "r", *_fast_args("--iterations", "2")])
    assert again.exit_code == 2 and "already holds a run" in again.output
    more = runner.invoke(app, ["train", "--resume", "r", "--iterations", "3"])
    assert more.exit_code == 0, more.output
    assert "resuming at iteration 2" in more.output and "iter    3/3" in more.output
    assert (run / "checkpoints" / "iter_000003").is_dir()
    conflict = runner.invoke(app, ["train", "--resume", "r", "--model", "tiny"])
    assert conflict.exit_code == 2 and "--resume continues a run" in conflict.output


def test_eval_scores_a_run_against_its_base_and_writes_every_image(in_tmp):
    import json

    assert runner.invoke(app, ["train", *_fast_args("--iterations", "1", "--run-dir", "r")]).exit_code == 0
    Path("p.txt").write_text("a red circle\na blue square left of a green triangle\n")
    result = runner.invoke(app, ["eval", "r", "--prompts", "p.txt", "--seeds", "2", "--steps", "2", "--out", "ev",
                                 "--weights", "ema,trained", "--save-images"])
    assert result.exit_code == 0, result.output
    assert "tinyworld_geneval" in result.output and "strict_accuracy" in result.output and "delta" in result.output
    rows = [json.loads(line) for line in Path("ev/samples.jsonl").read_text().splitlines()]
    assert [r["weights"] for r in rows] == ["base"] * 4 + ["ema"] * 4 + ["trained"] * 4
    assert all(Path("ev", r["image"]).is_file() for r in rows)
    assert rows[0]["seed"] == rows[4]["seed"]  # same seeds for every weight set
    summary = json.loads(Path("ev/summary.json").read_text())
    assert summary["base"]["rewards"]["tinyworld_geneval"]["delta"] == 0.0
    ema = summary["ema"]["rewards"]["tinyworld_geneval"]
    assert ema["delta"] == pytest.approx(ema["mean"] - summary["base"]["rewards"]["tinyworld_geneval"]["mean"])
    assert ema["delta_se"] >= 0.0 and "s.e." in result.output
    assert set(summary["ema"]["extras_delta_se"]) == {"tinyworld_geneval.object", "tinyworld_geneval.position"}


def test_a_run_draws_each_evaluation_and_eval_reads_its_kept_base_back_unless_the_images_differ(in_tmp):
    import json

    trained = runner.invoke(app, ["train", *_fast_args("--iterations", "1", "--run-dir", "r")])
    assert trained.exit_code == 0, trained.output
    # each evaluation draws its picture, and the end summary names the last one's
    assert Path("r/pictures/eval_000000.png").is_file() and Path("r/pictures/eval_000001.png").is_file()
    summary_at = trained.output.index("done: 1 iteration")
    assert "picture: r/pictures/eval_000001.png (base beside ema, same seeds)" in trained.output[summary_at:]
    next_at = trained.output.index("  next:", summary_at)  # the next commands, the run folder filled in
    assert trained.output[next_at:].splitlines()[1:4] == ["    solrl eval r", "    solrl infer r --prompt 'a red "
                                                                              "circle'",
                                                          "    solrl export r"], trained.output[next_at:]
    kept = json.loads(Path("r/eval_base.json").read_text())
    same = runner.invoke(app, ["eval", "r", "--out", "ev"])  # the run's own prompts, seeds, steps and rewards
    assert same.exit_code == 0, same.output
    assert "base from r/eval_base.json, written " in same.output and "digest ok" in same.output
    assert "evaluating the base weights" not in same.output
    summary = json.loads(Path("ev/summary.json").read_text())
    assert summary["base"]["rewards"]["total"]["mean"] == pytest.approx(sum(kept["total"]) / len(kept["total"]))
    assert "tinyworld_fidelity" in summary["ema"]["eval_rewards"]  # the eval reward's base came back too
    rows = [json.loads(line) for line in Path("ev/samples.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows if r["weights"] == "base"] == pytest.approx(kept["total"])
    other = runner.invoke(app, ["eval", "r", "--seeds", "2", "--out", "ev2"])  # other seeds: scored again
    assert other.exit_code == 0, other.output
    assert "base from" not in other.output and "evaluating the base weights" in other.output


def test_eval_errors_are_one_line(in_tmp):
    result = runner.invoke(app, ["eval", "nowhere"])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = runner.invoke(app, ["eval", "--weights", "best"])
    assert result.exit_code == 2 and "expected ema, trained" in result.output
    result = runner.invoke(app, ["eval", "--reward", "imagereward=1,pikscore=1"])
    assert result.exit_code == 2 and "did you mean 'pickscore'" in result.output


def test_infer_writes_base_and_tuned_images_a_grid_and_an_index(in_tmp):
    import json

    from PIL import Image

    assert runner.invoke(app, ["train", *_fast_args("--iterations", "1", "--run-dir", "r")]).exit_code == 0
    result = runner.invoke(app, ["infer", "r", "--prompt", "a red circle", "--prompt", "two blue squares", "--seeds",
                                 "2",
                                 "--steps", "2", "--out", "im"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in Path("im/images.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["weights"] for r in rows} == {"base", "ema"}
    assert [r["seed"] for r in rows[:4]] == [0, 1, 0, 1]
    assert all(Path("im", r["path"]).is_file() for r in rows)
    grid = Image.open("im/grid.png")
    assert grid.width > grid.height / 4 * 1.5  # two columns side by side, four rows
    bad = runner.invoke(app, ["infer", "r", "--prompt", "x", "--prompts", "tiny"])
    assert bad.exit_code == 2 and "both --prompt and --prompts" in bad.output


def test_export_writes_the_lora_or_a_merged_transformer_equal_to_the_tuned_model(in_tmp):
    import torch
    from diffusers import SanaTransformer2DModel

    from solrl_core.config.convert import load_run_config
    from solrl_core.engine.checkpoint import list_checkpoints
    from solrl_core.engine.engine import open_engine

    assert runner.invoke(app, ["train", *_fast_args("--iterations", "1", "--run-dir", "r")]).exit_code == 0
    lora = runner.invoke(app, ["export", "r", "--out", "lora"])
    assert lora.exit_code == 0 and Path("lora/pytorch_lora_weights.safetensors").is_file(), lora.output
    merged = runner.invoke(app, ["export", "r", "--out", "full", "--merge", "--weights", "trained"])
    assert merged.exit_code == 0, merged.output
    again = runner.invoke(app, ["export", "r", "--out", "full"])
    assert again.exit_code == 2 and "already holds an export" in again.output and "--overwrite" in again.output

    loaded = open_engine(load_run_config("r"), checkpoint=list_checkpoints(Path("r"))[-1])
    plain = SanaTransformer2DModel.from_pretrained("full/transformer")
    cond = loaded.conditioning(["a red circle", "a blue square"])
    x, s = torch.randn(2, *loaded.model.latent_shape), torch.tensor([0.8, 0.3])
    with torch.no_grad(), loaded.policy.weights("trained") as net:
        tuned = loaded.model.velocity(net, x, s, cond)
        with loaded.policy.weights("base") as base:
            untuned = loaded.model.velocity(base, x, s, cond)
        exported = loaded.model.velocity(plain, x, s, cond)
    assert torch.allclose(exported, tuned, atol=1e-5)
    assert not torch.allclose(exported, untuned, atol=1e-5)


def test_version_and_short_help():
    from importlib.metadata import version

    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"solrl {version('solrl')}"
    for args in (["-h"], ["train", "-h"]):
        out = runner.invoke(app, args)
        assert out.exit_code == 0 and "--help" in out.output and "Usage" in out.output, args
    assert "--resume" in runner.invoke(app, ["train", "-h"]).output
