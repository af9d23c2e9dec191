"""Reward plugins: the user's own reward from a file, a module path or an installed entry point, used
by train, eval and explore (and by every process of --nproc-per-node 2) exactly as it scores; a bad
plugin is one clear line, before the model loads where that can be known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app
from tests.conftest import FAST

runner = CliRunner()

# The plugin: a score no built-in gives (7 + mean brightness), logged so a test can compare what a
# command reports with what the plugin returned.
PLUGIN = '''
import json, os
import torch

def score(images, prompts):
    s = images.float().mean(dim=(1, 2, 3)) + 7.0
    with open(os.environ["PLUGIN_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "scores": s.tolist(), "prompts": list(prompts)}) + "\\n")
    return s
'''
CLASS_PLUGIN = PLUGIN + '''

class Brightness:
    def __init__(self, ctx):
        self.device = ctx.device

    def __call__(self, images, prompts):
        return score(images, prompts) - 7.0 + 5.0
'''


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    monkeypatch.setenv("PLUGIN_LOG", str(tmp_path / "plugin.jsonl"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # a module plugin puts the current folder on it
    return tmp_path


def _fast(*extra: str) -> list[str]:
    return [a for s in FAST for a in ("--set", s)] + list(extra)


def _logged(tmp_path: Path) -> list[dict]:
    path = tmp_path / "plugin.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _iterations(run: Path) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == "iteration"]


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_a_file_plugin_trains_evaluates_and_explores(in_tmp):
    Path("plug.py").write_text(PLUGIN)
    _invoke("train", "--reward", "plug.py:score", "--iterations", "2", "--run-dir", "r", *_fast())
    iterations = _iterations(in_tmp / "r")
    assert len(iterations) == 2 and all(set(it["final"]["components"]) == {"plug.py:score"} for it in iterations)
    # the plugin's scores, not the tiny world's [0, 1]
    assert all(7.0 <= it["final"]["mean"] <= 8.0 for it in iterations)

    Path("p.txt").write_text("a red circle\na blue square\n")
    (in_tmp / "plugin.jsonl").unlink()
    result = _invoke("eval", "r", "--prompts", "p.txt", "--seeds", "2", "--steps", "2", "--out", "ev",
                     "--trust-run-config")
    assert "plug.py:score" in result.output
    summary = json.loads(Path("ev/summary.json").read_text())
    logged = [s for call in _logged(in_tmp) for s in call["scores"]]
    assert len(logged) == 8  # base and EMA, 2 prompts x 2 seeds each
    means = sorted(summary[w]["rewards"]["plug.py:score"]["mean"] for w in ("base", "ema"))
    assert sum(means) * 4 == pytest.approx(sum(logged), rel=1e-5)

    (in_tmp / "plugin.jsonl").unlink()
    _invoke("explore", "--reward", "plug.py:score", "--prompt", "a red circle", "--n", "8", "--k", "4", "--steps", "2",
            "--out", "ex", *_fast())
    rows = [json.loads(line) for line in Path("ex/seeds.jsonl").read_text().splitlines()]
    logged = sorted(s for call in _logged(in_tmp) for s in call["scores"])
    assert sorted(r["reward"] for r in rows) == pytest.approx(logged, abs=1e-6) and len(rows) == 8


def test_a_module_plugin_class_gets_the_context_and_weights_combine(in_tmp):
    Path("house_rewards").mkdir()
    Path("house_rewards/__init__.py").write_text("")
    Path("house_rewards/scores.py").write_text(CLASS_PLUGIN)
    _invoke("explore", "--reward", "house_rewards.scores:Brightness=2,jpeg_compressibility=0",
            "--prompt", "a red circle", "--n", "8", "--k", "4", "--steps", "2", "--out", "ex", *_fast())
    rows = [json.loads(line) for line in Path("ex/seeds.jsonl").read_text().splitlines()]
    returned = sorted(s - 2.0 for call in _logged(in_tmp) for s in call["scores"])  # the class's own score: 5 + mean
    assert sorted(r["reward.house_rewards.scores:Brightness"] for r in rows) == pytest.approx(returned, abs=1e-6)
    # weight 2, jpeg weight 0
    assert sorted(r["reward"] for r in rows) == pytest.approx([2 * s for s in returned], abs=1e-5)

    _invoke("train", "--reward", "house_rewards.scores:Brightness", "--iterations", "2", "--run-dir", "r", *_fast())
    assert all(5.0 <= it["final"]["mean"] <= 6.0 for it in _iterations(in_tmp / "r"))


def _install(site: Path, name: str = "sharpness") -> None:
    """A package installed into `site` as pip would: its code, and a .dist-info with an entry point."""
    (site / "solrl_demo_plugin").mkdir(parents=True)
    (site / "solrl_demo_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "solrl_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: solrl-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[solrl.rewards]\n{name} = solrl_demo_plugin:score\n")


def test_an_installed_entry_point_is_listed_checked_and_used_by_name(in_tmp, monkeypatch):
    _install(in_tmp / "site")
    monkeypatch.syspath_prepend(str(in_tmp / "site"))
    monkeypatch.delitem(sys.modules, "solrl_demo_plugin", raising=False)
    listed = _invoke("presets")
    assert "sharpness" in listed.output and "solrl-demo-plugin 0.1" in listed.output
    checks = json.loads(_invoke("doctor", "--reward", "sharpness", "--json").output)
    row = next(c for c in checks if c["name"] == "reward plugin sharpness")
    assert row["status"] == "pass" and "score" in row["detail"]

    _invoke("train", "--reward", "sharpness", "--iterations", "2", "--run-dir", "r", *_fast())
    iterations = _iterations(in_tmp / "r")
    assert all(set(it["final"]["components"]) == {"sharpness"} and 7.0 <= it["final"]["mean"] <= 8.0
               for it in iterations)


BAD = {
    "broken.py": "import not_a_module_anywhere\n",
    "shapes.py": ("import math, torch\nVALUE = 3\ndef one(images):\n    return images.mean()\ndef scalar(images, "
                  "prompts):\n    return images.mean()\ndef listed(images, prompts):\n    return [0.5] * "
                  "images.shape[0]\ndef nan(images, prompts):\n    return torch.full((images.shape[0],), "
                  "math.nan)\nclass NoCall:\n    pass\nclass TwoArgs:\n    def __init__(self, a, b):\n        pass\n   "
                  " def __call__(self, images, prompts):\n        return images.mean((1, 2, 3))\n"),
}


@pytest.mark.parametrize("reward,message", [
    ("broken.py:score", "failed to import broken.py: ModuleNotFoundError: No module named 'not_a_module_anywhere'"),
    ("no_such_package_xyz.rewards:score",
     "failed to import: ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    ("shapes.py:nothere", "has no attribute 'nothere' in shapes.py"),
    ("shapes.py:VALUE", "is not callable: it is a int"),
    ("shapes.py:one", "cannot be called as (images, prompts): its signature is (images)"),
    ("shapes.py:NoCall", "is a class without __call__"),
    ("shapes.py:TwoArgs", "is a class whose __init__(a, b) needs more than one argument"),
    ("missing.py:score", ": the file missing.py does not exist"),
    ("shapes.py:scalar:0.5", "a weight follows '=', not ':'"),
])
def test_a_plugin_that_cannot_work_is_one_line_before_the_model_loads(in_tmp, reward, message):
    for name, text in BAD.items():
        Path(name).write_text(text)
    for command in (["train", "--run-dir", "r"], ["explore", "--prompt", "a red circle", "--out", "ex"]):
        result = runner.invoke(app, [*command, "--reward", reward, *_fast()])
        assert result.exit_code == 2, result.output
        error = next(line for line in result.output.splitlines() if line.startswith("error:"))
        assert reward in error and message in error, result.output  # one line: the plugin and what is wrong
        assert "fix:" in result.output
        # refused before the run folder, and the model, were made
        assert not Path("r").exists() and not Path("ex").exists()


@pytest.mark.parametrize("attr,message", [
    ("scalar", "reward plugin 'shapes.py:scalar' returned shape [] for 8 images, not [8]"),
    ("listed", "reward plugin 'shapes.py:listed' returned a list, not a torch.Tensor"),
    ("nan", "reward plugin 'shapes.py:nan' returned NaN or infinity for every one of the 8 images of its first batch"),
])
def test_a_plugin_whose_scores_are_wrong_is_named_at_its_first_call(in_tmp, attr, message):
    Path("shapes.py").write_text(BAD["shapes.py"])
    result = runner.invoke(app, ["explore", "--reward", f"shapes.py:{attr}", "--prompt", "a red circle", "--n", "8",
                                 "--k", "4",
                                 "--steps", "2", "--out", "ex", *_fast()])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_the_weight_list_rule():
    from solrl_core.rewards import label, parse_weights

    assert parse_weights("imagereward=1,mypkg.rewards:ocr=0.5,remote:http://h:8000=2,dir/f.py:score") == {
        "imagereward": 1.0, "mypkg.rewards:ocr": 0.5, "remote:http://h:8000": 2.0, "dir/f.py:score": 1.0}
    assert label("dir/f.py:score") == "f-score" and label("mypkg.rewards:ocr") == "mypkg.rewards-ocr"


@pytest.mark.slow
def test_every_process_of_a_two_process_run_scores_with_the_plugin(in_tmp):
    Path("plug.py").write_text(PLUGIN)
    sets = [a
            for s in (*FAST, "run.threads=1", "sampler.rollout_batch=4", "optimizer.micro_batch=4", "run.eval_prompts=")
            for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "solrl_cli", "train", "--nproc-per-node", "2", "--iterations", "2",
                           "--reward", "plug.py:score", "--run-dir", "r", *sets], capture_output=True, text=True,
                          timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "SOLRL_DEBUG": "", "COLUMNS": "300"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    iterations = _iterations(in_tmp / "r")
    assert len(iterations) == 2 and all(set(it["final"]["components"]) == {"plug.py:score"} for it in iterations)
    assert all(7.0 <= it["final"]["mean"] <= 8.0 for it in iterations)
    assert len({call["pid"] for call in _logged(in_tmp)}) == 2  # both processes scored with it


def test_processes_holding_different_plugin_code_stop_together_naming_it(in_tmp, monkeypatch):
    from solrl_core.rewards import RewardSet
    from solrl_core.runtime import distributed

    Path("plug.py").write_text(PLUGIN)
    assert RewardSet({"plug.py:score": 1.0}).rewards["plug.py:score"].fingerprint.startswith("score sha256:")
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(distributed, "any_true", lambda flag: flag)
    # rank 0's
    monkeypatch.setattr(distributed, "broadcast_object", lambda mine: {n: "score sha256:0123" for n in mine})
    with pytest.raises(Exception, match=r"reward plugin 'plug.py:score' is not the same code on every process: rank 1 "
                                        r"loaded score sha256:\w+, rank 0 score sha256:0123"):
        RewardSet({"plug.py:score": 1.0})
