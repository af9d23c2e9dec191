"""`solrl export`: a default folder under the run, files peft and diffusers both open, modes others
can read, a model card whose numbers are the run's own, and a push to a stand-in of the hub API."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from tests.conftest import FAST

runner = CliRunner()


@contextlib.contextmanager
def umask(mask: int):  # type: ignore[no-untyped-def]
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _train(folder: Path, *sets: str) -> Path:
    args = [a for s in (*FAST, "sampler.eval_steps=2", *sets) for a in ("--set", s)]
    result = runner.invoke(app, ["train", *args, "--iterations", "1", "--run-dir", str(folder)])
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A one-iteration tiny run that evaluated the base and its EMA weights on held-out prompts."""
    root = tmp_path_factory.mktemp("evaluated")
    (root
     / "held_out.txt").write_text("a red circle left of a blue square\ntwo green triangles\nthree yellow circles\n")
    return _train(root / "run", f"run.eval_prompts={root / 'held_out.txt'}", "run.eval_seeds=2")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """A one-iteration tiny run with no evaluation."""
    return _train(tmp_path_factory.mktemp("plain") / "run", "run.eval_prompts=")


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mode & 0o777 for p in [folder, *folder.rglob("*")]}


def test_export_without_out_writes_under_the_run_with_peft_files_a_card_and_readable_modes(evaluated_run, monkeypatch):
    from huggingface_hub import ModelCard
    from peft import PeftModel

    from solrl_core.config.convert import load_run_config
    from solrl_core.engine.engine import open_engine
    from solrl_core.models import load_model

    monkeypatch.chdir(evaluated_run.parent)
    with umask(0o022):
        result = runner.invoke(app, ["export", "run"])
    assert result.exit_code == 0, result.output
    folder = Path("run/export/iter_000001-ema")
    assert str(folder) in result.output.replace("\n", "")
    names = {p.name for p in folder.iterdir()}
    assert names == {"pytorch_lora_weights.safetensors", "adapter_model.safetensors", "adapter_config.json",
                     "README.md",
                     "solrl_export.json"}  # the record of what it wrote: all --overwrite replaces
    modes = _modes(folder)
    assert modes.pop(".") == 0o755 and set(modes.values()) == {0o644}, modes
    again = runner.invoke(app, ["export", "run"])
    assert again.exit_code == 2 and "fix: add --overwrite to replace it" in again.output, again.output

    # The modes follow the umask, as a file the user created would.
    with umask(0o027):
        assert runner.invoke(app, ["export", "run", "--out", "private"]).exit_code == 0
    modes = _modes(Path("private"))
    assert modes.pop(".") == 0o750 and set(modes.values()) == {0o640}, modes

    # A merged export: its own default folder, readable, a card without the lora tag.
    with umask(0o022):
        merged = runner.invoke(app, ["export", "run", "--merge"])
    assert merged.exit_code == 0, merged.output
    merged_dir = folder.parent / "iter_000001-ema-merged"
    modes = _modes(merged_dir)
    assert (merged_dir / "transformer" / "config.json").is_file()
    assert {m for name, m in modes.items() if (merged_dir / name).is_dir()} == {0o755}
    assert {m for name, m in modes.items() if (merged_dir / name).is_file()} == {0o644}
    merged_card = ModelCard.load(merged_dir / "README.md")
    assert "lora" not in merged_card.data.tags and 'subfolder="transformer"' in merged_card.text

    # The card: hub front matter, the run's settings, and its evaluation numbers as events.jsonl has them.
    cfg = load_run_config("run")
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "diffusers" and {"lora", "solrl", cfg.algorithm.family} <= set(card.data.tags)
    assert f"| iterations | 1 (of {cfg.run.iterations} planned) |" in card.text
    assert f"rank {cfg.model.lora_rank}, alpha {cfg.model.lora_alpha}" in card.text
    events = [json.loads(line) for line in Path("run/events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    base, tuned = evals[0], evals[-1]
    assert (base["weights"], tuned["weights"], tuned["iteration"]) == ("base", "ema", 1)
    se = tuned["delta_se"]["mean"]
    assert (((((f"| reward | {base['mean']:.4f} | {tuned['mean']:.4f} | {tuned['mean'] - base['mean']:+.4f} ± {se:.4f} "
                f"|" in card.text)))))
    for key, value in tuned["extras"].items():
        assert f"| {key} | {base['extras'][key]:.4f} | {value:.4f} |" in card.text
    assert "PeftModel.from_pretrained" in card.text and "SanaPipeline" not in card.text  # tiny: no diffusers pipeline

    # peft opens it on a plain copy of the base transformer, and it is the run's EMA weights.
    loaded = open_engine(cfg, checkpoint=Path("run/checkpoints/iter_000001"))
    peft_net = PeftModel.from_pretrained(load_model(cfg.model, torch.device("cpu"), torch.float32).transformer,
                                         str(folder))
    cond = loaded.conditioning(["a red circle"])
    x, s = torch.randn(1, *loaded.model.latent_shape), torch.tensor([0.7])
    with torch.no_grad(), loaded.policy.weights("ema") as net:
        assert torch.allclose(loaded.model.velocity(peft_net, x, s, cond), loaded.model.velocity(net, x, s, cond),
                              atol=1e-6)


def test_a_second_export_is_refused_naming_overwrite_which_replaces_only_an_export(evaluated_run, tmp_path):
    out = tmp_path / "out"
    assert runner.invoke(app, ["export", str(evaluated_run), "--out", str(out)]).exit_code == 0
    (out / "README.md").write_text((out / "README.md").read_text() + "\nedited by hand\n")
    again = runner.invoke(app, ["export", str(evaluated_run), "--out", str(out), "--weights", "trained"])
    assert again.exit_code == 2 and "already holds an export" in again.output and "--overwrite" in again.output
    replaced = runner.invoke(app, ["export", str(evaluated_run), "--out", str(out), "--weights", "trained",
                                   "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert "edited by hand" not in (out / "README.md").read_text() and "| weights | trained |" in (out
            / "README.md").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no set-aside or partial folder left beside it

    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = runner.invoke(app, ["export", str(evaluated_run), "--out", str(other), "--overwrite"])
    assert refused.exit_code == 2 and "not empty" in refused.output, refused.output
    assert "--overwrite" not in refused.output.split("fix:", 1)[1] and (other / "notes.txt").read_text() == "mine"


def test_a_tiny_card_loads_with_its_own_code_and_shows_the_eval_rewards(evaluated_run, tmp_path):
    """The card's code runs as written (the tiny model has no diffusers pipeline) and gives the EMA weights."""
    from huggingface_hub import ModelCard

    from solrl_core.config.convert import load_run_config
    from solrl_core.engine.engine import open_engine

    out = tmp_path / "lora"
    exported = runner.invoke(app, ["export", str(evaluated_run), "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    # the terminal shows the same loading code as the card: the tiny model has no pipeline to call load_lora_weights on
    assert ("load_lora_weights" not in exported.output
            and f'PeftModel.from_pretrained(model.transformer, "{out}")' in exported.output)
    card = ModelCard.load(out / "README.md").text
    assert "SanaPipeline" not in card and "load_lora_weights" not in card
    code = card.split("```python\n", 1)[1].split("```", 1)[0].replace("path/to/this/folder", str(out))
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the card's own example, as a user would paste it
    events = [json.loads(line) for line in (evaluated_run / "events.jsonl").read_text().splitlines()]
    base, tuned = [e for e in events if e["event"] == "eval"][::len([e for e in events if e["event"] == "eval"]) - 1]
    assert tuned["eval_rewards"], "the tiny preset evaluates tinyworld_fidelity"
    for name, now in tuned["eval_rewards"].items():
        change = f"{now - base['eval_rewards'][name]:+.4f} ± {tuned['eval_se'][name]:.4f}"
        assert f"| {name} (eval only) | {base['eval_rewards'][name]:.4f} | {now:.4f} | {change} |" in card

    loaded = open_engine(load_run_config(evaluated_run), checkpoint=evaluated_run / "checkpoints/iter_000001")
    cond = loaded.conditioning(["a red circle"])
    x, s = torch.randn(1, *loaded.model.latent_shape), torch.tensor([0.7])
    with torch.no_grad(), loaded.policy.weights("ema") as net:
        assert torch.allclose(scope["model"].velocity(scope["model"].transformer, x, s, cond),
                              loaded.model.velocity(net, x, s, cond), atol=1e-6)


def test_a_real_sana_export_opens_in_peft_and_diffusers_and_equals_the_merged_weights(tmp_path, monkeypatch):
    from diffusers import SanaTransformer2DModel
    from huggingface_hub import ModelCard
    from peft import PeftModel

    from solrl_core import events as ev
    from solrl_core.config.presets import resolve_config
    from solrl_core.engine.engine import open_engine
    from solrl_core.engine.policy import TRAINED
    from solrl_core.loop.trainer import StopFlag, train
    from tests.helpers import diffusers_pipeline as _pipeline, REAL_FAST
    from tests.tiny_pipelines import save_tiny_pipeline

    base = save_tiny_pipeline("sana", tmp_path / "sana")
    (base / "README.md").write_text("---\nlicense: other\nlicense_name: test-base-license\n---\n# base\n")
    # run.seed=1: with seed 0 the two kept images tie on JPEG size and nothing trains (test_real_models).
    cfg = resolve_config("sana", "sol_rl", "jpeg_compressibility",
                         sets=[*REAL_FAST, f"model.path={base}", f"run.run_dir={tmp_path / 'run'}", "run.seed=1"])
    session = train(cfg, ev.EventBus(), stop=StopFlag())
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export", "run", "--weights", "trained"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "run/export/iter_000001-trained"

    card = ModelCard.load(folder / "README.md")
    assert (card.data.license, card.data.license_name, card.data.base_model) == ("other", "test-base-license",
                                                                                 cfg.model.hub_id)
    assert "license is `test-base-license`" in card.text
    settings = json.loads((folder / "adapter_config.json").read_text())
    assert (settings["r"], settings["lora_alpha"]) == (cfg.model.lora_rank, cfg.model.lora_alpha)
    assert sorted(settings["target_modules"]) == sorted(cfg.model.lora_targets) and settings["peft_type"] == "LORA"

    loaded = open_engine(cfg, checkpoint=tmp_path / "run/checkpoints/iter_000001")
    with loaded.policy.weights("trained"):
        merged = loaded.policy.merged_weights(TRAINED)
    solrl_merged = SanaTransformer2DModel.from_pretrained(str(base), subfolder="transformer")
    untouched = solrl_merged.load_state_dict(merged, strict=False)
    assert not untouched.unexpected_keys
    peft_net = PeftModel.from_pretrained(SanaTransformer2DModel.from_pretrained(str(base), subfolder="transformer"),
                                         str(folder))
    pipe = _pipeline("sana", base)
    pipe.load_lora_weights(str(folder))
    plain = SanaTransformer2DModel.from_pretrained(str(base), subfolder="transformer")

    cond = session.run.engine.conditioning(["a red circle"])
    x, s = torch.randn(1, *session.run.engine.model.latent_shape), torch.tensor([0.7])
    v = lambda net: session.run.engine.model.velocity(net, x, s, cond)  # noqa: E731
    with torch.no_grad():
        expected, by_peft, by_diffusers, untuned = v(solrl_merged), v(peft_net), v(pipe.transformer), v(plain)
    assert torch.allclose(by_peft, expected, atol=1e-5), (by_peft - expected).abs().max()
    assert torch.allclose(by_diffusers, expected, atol=1e-5)
    assert not torch.allclose(expected, untuned, atol=1e-5)


class _Hub:
    """A stand-in of the hub API on 127.0.0.1: the endpoints `create_repo` and `upload_folder` call,
    answering every file 'regular' (sent inline, base64) as the hub does for small files."""

    def __init__(self) -> None:
        self.created: list[dict] = []
        self.files: dict[str, bytes] = {}
        self.auth: set[str] = set()
        self.unknown: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # type: ignore[no-untyped-def]
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hub.auth.add(self.headers.get("Authorization", ""))
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    hub.created.append(json.loads(body))
                    name = hub.created[-1]
                    return self._reply(200, {"url": f"{hub.url}/{name['organization']}/{name['name']}"})
                if path == "/api/validate-yaml":
                    return self._reply(200, {"errors": [], "warnings": []})
                if "/preupload/" in path:
                    files = json.loads(body)["files"]
                    return self._reply(200,
                                       {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                       for f in files]})
                if "/commit/" in path:
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    repo = path.removeprefix("/api/models/").split("/commit/")[0]
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{'1' * 40}", "commitOid": "1" * 40,
                                             "pullRequestUrl": None})
                hub.unknown.append(path)
                return self._reply(404, {"error": f"no {path} in this stand-in"})

            do_GET = do_PUT = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Hub:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.stop = threading.Timer(120, self.server.shutdown)  # stops by itself should the test hang
        self.stop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.cancel()
        self.server.shutdown()
        self.server.server_close()


def test_push_to_hub_uploads_exactly_the_export_to_a_stand_in_hub(plain_run, monkeypatch):
    from huggingface_hub import ModelCard

    monkeypatch.chdir(plain_run.parent)
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    with _Hub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = runner.invoke(app, ["export", "run", "--push-to-hub", "me/tiny-lora", "--private"])
    assert result.exit_code == 0, result.output
    folder = Path("run/export/iter_000001-ema")
    (created,) = hub.created
    assert (created["organization"], created["name"]) == ("me", "tiny-lora")
    assert created.get("visibility") == "private" or created.get("private") is True, created
    assert hub.files == {p.name: p.read_bytes() for p in folder.iterdir()}
    assert hub.auth == {"Bearer hf_standin"} and not hub.unknown
    assert f"{hub.url}/me/tiny-lora" in result.output
    card = ModelCard.load(folder / "README.md")
    assert "Not evaluated" in card.text and 'PeftModel.from_pretrained(model.transformer, "me/tiny-lora")' in card.text


def test_push_errors_are_one_line_and_name_the_fix(plain_run, monkeypatch, tmp_path):
    from huggingface_hub import constants

    from solrl_core.errors import SolrlError
    from solrl_core.tools import hub

    monkeypatch.chdir(plain_run.parent)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    none = runner.invoke(app, ["export", "run", "--push-to-hub", "me/x", "--out", "no_token"])
    assert none.exit_code == 2 and "no Hugging Face token" in none.output
    assert "HF_TOKEN" in none.output and "hf auth login" in none.output and not Path("no_token").exists()

    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    with _Hub() as closed:  # a port that held a server a moment ago and now refuses connections
        dead = closed.url
    monkeypatch.setenv("HF_ENDPOINT", dead)
    down = runner.invoke(app, ["export", "run", "--push-to-hub", "me/x", "--out", "kept"])
    assert down.exit_code == 2 and f"cannot reach the hub at {dead}" in down.output.replace("\n", ""), down.output
    assert "HF_ENDPOINT" in down.output and (Path("kept") / "README.md").is_file()

    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)
    with pytest.raises(SolrlError, match="needs huggingface_hub") as missing:
        hub.check_push("me/x")
    assert missing.value.fix == "pip install huggingface_hub"
