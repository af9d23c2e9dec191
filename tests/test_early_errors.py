"""Mistakes in a run's own inputs (a prompt file, --device, prompts the reward cannot judge, a remote
reward server) are said before the doctor's checks of the machine (its imports of diffusers and the
reward backends took 16-67 s on a busy machine) and before any model loads."""

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app

runner = CliRunner()


@pytest.fixture
def heavy(monkeypatch, tmp_path):
    """What ran of the slow work: the doctor's checks and the model load (each recorded, then refused)."""
    import solrl_core.doctor as doctor
    import solrl_core.engine.engine as engine

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    ran = []

    def doctor_checks(*args, **kwargs):
        ran.append("doctor")
        return []

    def load_model(*args, **kwargs):
        ran.append("model")
        raise RuntimeError("the model was loaded")

    monkeypatch.setattr(doctor, "run_checks", doctor_checks)
    monkeypatch.setattr(engine, "load_model", load_model)
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
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = runner.invoke(app, ["train", *args, "--run-dir", "r"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "fix:" in result.output
    assert heavy == []  # neither the doctor's checks nor the model load ran
    assert not (tmp_path / "r").exists()

