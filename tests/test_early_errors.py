"""Mistakes in a run's own inputs (a prompt file, --device, prompts the reward cannot judge, a remote
reward server) are said before the doctor's checks of the machine (its imports of diffusers and the
reward backends took 16-67 s on a busy machine) and before any model loads."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def heavy(monkeypatch, tmp_path):
    """What ran of the slow work: the doctor's checks, the trainer and the model load (each recorded;
    the doctor's and the model's then refused)."""
    import solrl_core.doctor as doctor
    import solrl_core.engine.engine as engine
    import solrl_core.loop.trainer as trainer

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    ran = []
    train = trainer.train

    def doctor_checks(*args, **kwargs):
        ran.append("doctor")
        return []

    def load_model(*args, **kwargs):
        ran.append("model")
        raise RuntimeError("the model was loaded")

    def trainer_train(*args, **kwargs):
        ran.append("trainer")
        return train(*args, **kwargs)

    monkeypatch.setattr(doctor, "run_checks", doctor_checks)
    monkeypatch.setattr(engine, "load_model", load_model)
    monkeypatch.setattr(trainer, "train", trainer_train)
    return ran


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda is valid")


@pytest.mark.parametrize("args,files,message", [
    (["--prompts", "missing.txt"], {}, "prompt file missing.txt does not exist"),
    (["--prompts", "p.txt"], {"p.txt": "a purple elephant\n"}, "cannot judge prompt 0 ('a purple elephant')"),
    (["--set", "run.eval_prompts=gone.jsonl"], {}, "check the path given to --set run.eval_prompts"),
    pytest.param(["--device", "cuda"], {}, "torch sees no GPU", marks=no_gpu),
    (["--reward", "remote:http://127.0.0.1:9"], {}, "is not reachable"),
])
def test_an_input_error_comes_before_the_doctor_and_the_model(heavy, tmp_path, args, files, message):
    """... and its fix never sends the user to resume a run that was never started."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = runner.invoke(app, ["train", *args, "--run-dir", "r"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "fix:" in result.output and "--resume" not in result.output
    if "remote:" in args[1]:
        assert ((((((((((((((("fix: start the server (or check the URL and the network), then run the same command "
                              "again" in result.output)))))))))))))))
    assert heavy == []  # neither the doctor's checks nor the model load ran
    assert not (tmp_path / "r").exists()



# --- the Python API comes in by the same door (solrl_core/tools/start.py) ---------------------------

_API_PROBE = """
import sys
from solrl import train
from solrl_core.errors import SolrlError
try:
    train(sets=sys.argv[1:], run_dir="r")
except SolrlError as exc:
    print("ERROR", exc.message)
    print("FIX", exc.fix)
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


def test_the_api_says_a_missing_prompt_file_in_one_line_before_torch_loads(tmp_path):
    """As `solrl train --prompts missing.txt` says it: a SolrlError of one line and its fix, in a
    second, before torch (let alone a model) loads and before the run folder is made."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SOLRL_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", _API_PROBE, "run.prompts=missing.txt"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "ERROR prompt file missing.txt does not exist", proc.stdout + proc.stderr
    assert lines[1].startswith("FIX ") and len(lines[1]) > len("FIX ")
    assert lines[-1] == "NO-TORCH" and len(lines) == 3
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kwargs,message", [
    ({"reward": "remote:http://127.0.0.1:9"}, "is not reachable"),
    ({"sets": ["run.eval_prompts=gone.jsonl"]}, "gone.jsonl"),
    pytest.param({"device": "cuda"}, "torch sees no GPU", marks=no_gpu),
])
def test_the_api_answers_other_input_errors_before_the_doctor_and_the_trainer(heavy, tmp_path, kwargs, message):
    from solrl import train
    from solrl_core.errors import SolrlError

    with pytest.raises(SolrlError, match=message):
        train(run_dir=tmp_path / "r", **kwargs)
    assert heavy == []


def test_the_api_runs_the_preflight_and_stops_on_a_failed_check_before_the_model(monkeypatch, heavy, tmp_path):
    """The doctor's checks the run depends on: one that fails stops the API's run as it stops the CLI's."""
    import solrl_core.doctor as doctor
    from solrl import train
    from solrl_core.doctor.check import FAIL, Check
    from solrl_core.errors import SolrlError

    def failing(cfg, nproc, only_needed=False, **given):  # type: ignore[no-untyped-def]
        heavy.append("doctor")
        return [Check("model weights", FAIL, "tiny model weights 'x' lack config.json", "leave model.weights empty",
                      True)]

    monkeypatch.setattr(doctor, "run_checks", failing)
    with pytest.raises(SolrlError) as caught:
        train(run_dir=tmp_path / "r")
    assert caught.value.message == "model weights: tiny model weights 'x' lack config.json"
    assert caught.value.fix == "leave model.weights empty"
    assert heavy == ["doctor"]  # the checks ran; the model never loaded


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """What each start-up step was handed: the input checks, the doctor's checks and the trainer (a
    stand-in that returns a finished session), each config as its dict."""
    import solrl_core.config.run_inputs as run_inputs
    import solrl_core.doctor as doctor
    import solrl_core.loop.trainer as trainer
    from solrl_core.config.convert import to_dict

    monkeypatch.chdir(tmp_path)
    calls: list = []
    check_inputs = run_inputs.check_inputs

    def inputs(cfg, resumed_from=None, api=False):  # type: ignore[no-untyped-def]
        calls.append(("inputs", to_dict(cfg), resumed_from and Path(resumed_from)))
        return check_inputs(cfg, resumed_from, api)

    def checks(cfg, nproc, only_needed=False, plan=None, prompts=None):  # type: ignore[no-untyped-def]
        calls.append(("doctor", to_dict(cfg), nproc, only_needed))
        return []

    def train(cfg, bus, resume=False, stop=None, checkpoint=None, checked=None):  # type: ignore[no-untyped-def]
        calls.append(("train", to_dict(cfg), resume, checkpoint))
        state = SimpleNamespace(iteration=cfg.run.iterations, finished=lambda n: True)
        return SimpleNamespace(run=SimpleNamespace(run_dir=cfg.run.run_dir, config=cfg), state=state)

    monkeypatch.setattr(run_inputs, "check_inputs", inputs)
    monkeypatch.setattr(doctor, "run_checks", checks)
    monkeypatch.setattr(trainer, "train", train)
    return calls


def test_both_doors_resolve_and_check_a_run_alike(recorded, tmp_path):
    """`solrl train` and `solrl.train()` with the same choices: the same resolved config handed to
    the same input checks, doctor checks and trainer, for a fresh run and for a resume."""
    from solrl import train
    from solrl_core.config.convert import from_dict, save_run_config

    sets = ["explore.steps=2", "run.eval_prompts="]
    cli = runner.invoke(app, ["train", "--reward", "jpeg_compressibility", "--iterations", "3", "--seed", "7",
                              "--run-dir", "a", *(a for s in sets for a in ("--set", s))])
    assert cli.exit_code == 0, cli.output
    by_cli = list(recorded)
    recorded.clear()
    train(reward="jpeg_compressibility", iterations=3, seed=7, run_dir="a", sets=sets)
    assert [c[0] for c in by_cli] == ["inputs", "doctor", "train"]
    assert recorded == by_cli

    (tmp_path / "a").mkdir()
    save_run_config(tmp_path / "a", from_dict(by_cli[-1][1]))  # the folder a first run would have left
    recorded.clear()
    cli = runner.invoke(app, ["train", "--resume", "a", "--iterations", "5", "--set", "run.eval_every=2"])
    assert cli.exit_code == 0, cli.output
    by_cli = list(recorded)
    recorded.clear()
    train(resume="a", iterations=5, sets=["run.eval_every=2"])
    assert [c[0] for c in by_cli] == ["inputs", "doctor", "train"] and by_cli[-1][2] is True
    assert recorded == by_cli
