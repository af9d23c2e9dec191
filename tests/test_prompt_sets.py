"""Prompt sets a real run can use: saved datasets, tables, hub datasets from the cache, the official
runs' prompt files by name, the doctor's check of each, and one per-prompt mean per prompt text.
Everything is built in a temporary folder; nothing here reaches past localhost."""

from __future__ import annotations

import dataclasses
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core.data.prompts import load_prompts
from solrl_core.errors import SolrlError

try:
    import datasets
except ImportError:  # the data extra (part of dev) is not installed: the tests that build datasets skip
    datasets = None
needs_datasets = pytest.mark.skipif(datasets is None, reason='needs the data extra: pip install -e ".[data]"')
runner = CliRunner()
CAPTIONS = ["a red cube", "", None, " a blue ball "]


@pytest.fixture(autouse=True)
def quiet_caches(tmp_path, monkeypatch):
    """Every cache in the temporary folder, and the hub offline."""
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    if datasets is not None:
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")


def _error(spec: str) -> SolrlError:
    with pytest.raises(SolrlError) as info:
        load_prompts(spec)
    return info.value


def test_specs_read_hub_ids_paths_splits_and_columns(tmp_path):
    from solrl_core.data.prompt_sets import PromptSpec, parse_spec

    assert parse_spec("hf:someone/prompts@test:caption") == PromptSpec("someone/prompts", True, "test", "caption")
    assert parse_spec("hf:someone/prompts") == PromptSpec("someone/prompts", True, "", "")
    assert parse_spec("data/p.parquet:caption") == PromptSpec("data/p.parquet", False, "", "caption")
    assert parse_spec("saved@validation:text") == PromptSpec("saved", False, "validation", "text")
    assert parse_spec("general") == PromptSpec("general")
    odd = tmp_path / "a:b.txt"  # a path that exists is read whole, colon and all
    odd.write_text("x\n")
    assert parse_spec(str(odd)) == PromptSpec(str(odd))
    assert load_prompts(str(odd)) == ["x"]
    assert "hf:OWNER/NAME" in _error("hf:no-owner").fix


@needs_datasets
def test_a_saved_dataset_loads_by_column_and_split(tmp_path):
    one = datasets.Dataset.from_dict({"caption": CAPTIONS, "n": [1, 2, 3, 4]})
    one.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": one, "test": one.select([0])}).save_to_disk(str(tmp_path / "splits"))
    assert load_prompts("saved:caption") == ["a red cube", "a blue ball"]  # empty and missing values skipped
    assert load_prompts("splits:caption") == ["a red cube", "a blue ball"]  # train unless named
    assert load_prompts("splits@test:caption") == ["a red cube"]
    missing = _error("saved")
    assert "no column 'prompt'" in missing.message and "caption, n" in missing.message and "saved:COLUMN" in missing.fix
    split = _error("splits@validation:caption")
    assert "no split 'validation'" in split.message and "train, test" in split.message
    assert "holds int values" in _error("saved:n").message
    assert "without splits" in _error("saved@train:caption").message
    (tmp_path / "plain").mkdir()
    assert "not a saved dataset" in _error("plain").message


@needs_datasets
def test_parquet_csv_and_jsonl_files_take_a_column(tmp_path):
    table = datasets.Dataset.from_dict({"caption": CAPTIONS, "empty": ["", "  ", None, ""]})
    table.to_parquet(str(tmp_path / "p.parquet"))
    table.to_csv(str(tmp_path / "c.csv"), index=False)
    (tmp_path / "j.jsonl").write_text(json.dumps({"caption": "a cat"}) + "\n" + json.dumps({"caption": "a dog"}) + "\n")
    assert load_prompts("p.parquet:caption") == load_prompts("c.csv:caption") == ["a red cube", "a blue ball"]
    assert load_prompts("j.jsonl:caption") == ["a cat", "a dog"]
    assert "its columns: caption, empty" in _error("p.parquet").message
    assert "its keys: caption" in _error("j.jsonl").message and "j.jsonl:KEY" in _error("j.jsonl").fix
    assert "holds no prompts" in _error("p.parquet:empty").message
    assert "without columns" in _error("general:caption").message
    assert "does not exist" in _error("nowhere.parquet:caption").message


def _hub_snapshot(tmp_path: Path, repo: str) -> None:
    """A hub dataset as `hf download` leaves it in the cache: refs/main and one snapshot of parquet files."""
    folder = tmp_path / "hub" / f"datasets--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40) / "data"
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    datasets.Dataset.from_dict({"caption": ["a green cone", "a tall tree"]}).to_parquet(str(snapshot
            / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_dict({"caption": ["a small dog"]}).to_parquet(str(snapshot / "test-00000-of-00001.parquet"))


@needs_datasets
def test_a_hub_dataset_loads_from_the_cache_offline(tmp_path):
    _hub_snapshot(tmp_path, "someone/prompts")
    assert load_prompts("hf:someone/prompts:caption") == ["a green cone", "a tall tree"]
    assert load_prompts("hf:someone/prompts@test:caption") == ["a small dog"]
    assert "no split 'nope'" in _error("hf:someone/prompts@nope:caption").message
    assert "its columns: caption" in _error("hf:someone/prompts").message
    absent = _error("hf:nobody/nothing")
    assert ("not in the Hugging Face cache" in absent.message
            and "hf download nobody/nothing --repo-type dataset" in absent.fix)


class _Files(http.server.BaseHTTPRequestHandler):
    """Answers GET and HEAD from a dict path -> (status, body)."""
    routes: dict[str, tuple[int, bytes]] = {}

    def do_GET(self):  # noqa: N802 - the handler's protocol
        status, body = self.routes.get(self.path, (404, b""))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self.send_response(self.routes.get(self.path, (404, b""))[0])
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    _Files.routes = {}


def test_download_sets_are_declared_once_and_checked_on_download(server, tmp_path):
    from solrl_core.data.prompt_sets import DownloadSet, download_sets, fetch_download, git_blob_id

    declared = download_sets()
    assert {"pickscore_train", "pickscore_test", "geneval_train", "ocr_train"} <= set(declared)
    for entry in declared.values():
        assert (entry.url.startswith("https://raw.githubusercontent.com/NVlabs/DiffusionNFT/24af5554")
                and len(entry.blob) == 40)
    body = b"a cat on a mat\na dog in fog\n"
    _Files.routes = {"/good.txt": (200, body), "/bad.txt": (200, b"changed\n")}
    good = DownloadSet("good", f"{server}/good.txt", git_blob_id(body), "test set", "here")
    with pytest.raises(SolrlError, match="HF_HUB_OFFLINE"):
        fetch_download(good, offline=True)
    path = fetch_download(good, offline=False)
    assert path == tmp_path / "xdg" / "solrl" / "prompts" / "good.txt" and path.read_bytes() == body
    _Files.routes = {}
    assert fetch_download(good, offline=True) == path  # cached: no network, offline too
    bad = DownloadSet("bad", f"{server}/bad.txt", git_blob_id(body), "test set", "here")
    _Files.routes = {"/bad.txt": (200, b"changed\n")}
    with pytest.raises(SolrlError, match="not the expected file"):
        fetch_download(bad, offline=False)
    assert not (tmp_path / "xdg" / "solrl" / "prompts" / "bad.txt").exists()


def test_a_cached_download_set_is_read_by_name_and_listed_by_presets(tmp_path):
    cached = tmp_path / "xdg" / "solrl" / "prompts" / "geneval_test.jsonl"
    assert "not downloaded" in _error("geneval_test").message  # offline and not cached
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"tag": "single_object", "prompt": "a photo of a bench"}) + "\n")
    assert load_prompts("geneval_test") == ["a photo of a bench"]
    result = runner.invoke(app, ["presets"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    row = _row(result.output, "pickscore_train")
    assert "needs a download" in row and "NVlabs/DiffusionNFT dataset/pickscore/train.txt" in row
    assert "downloaded: " in _row(result.output, "geneval_test")


@needs_datasets
def test_the_doctor_reads_local_sets_and_looks_for_hub_ones(tmp_path, server, monkeypatch):
    from solrl_core.config.schema import Config
    from solrl_core.doctor.check import Machine
    from solrl_core.doctor.prompts import prompt_checks

    datasets.Dataset.from_dict({"caption": ["a red cube", "a blue ball"]}).save_to_disk(str(tmp_path / "saved"))
    _hub_snapshot(tmp_path, "someone/prompts")
    m = Machine([], None, True, tmp_path / "hub")  # type: ignore[arg-type]

    def check(spec: str, machine: Machine = m):
        cfg = Config()
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, prompts=spec, eval_prompts=""))
        (found,) = prompt_checks(cfg, machine, timeout=2.0)
        return found

    assert (check("saved:caption").status, check("saved:caption").detail) == ("pass", "saved:caption: 2 prompts")
    assert check("saved").status == "fail" and "caption" in check("saved").detail
    assert check("hf:someone/prompts").status == "pass"
    offline = check("hf:nobody/nothing")
    assert offline.status == "fail" and offline.needed_by_run and "HF_HUB_OFFLINE" in offline.detail
    assert check("pickscore_test").status == "fail"  # not downloaded, offline
    online = dataclasses.replace(m, offline=False)
    monkeypatch.setenv("HF_ENDPOINT", server)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-token"))
    _Files.routes = {"/api/datasets/open/set": (200, b'{"gated": false}'),
                     "/api/datasets/closed/set": (200, b'{"gated": "manual"}')}
    assert check("hf:open/set", online).status == "warn"
    gated = check("hf:closed/set", online)
    assert gated.status == "fail" and "HF_TOKEN" in gated.fix
    assert check("hf:gone/set", online).status == "fail"  # 404


def test_equal_prompt_texts_share_one_mean():
    """Groups 0 and 2 drew the same text: one mean over both, as the official stat tracker pools by text."""
    from solrl_core.loop.stages import advantages, gather_scores

    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0, 7.0])
    batch = SimpleNamespace(prompts=["a", "a", "b", "b", "a", "a"], rewards=rewards, components={"r": rewards},
                            groups=torch.tensor([0, 0, 1, 1, 2, 2]))
    run = SimpleNamespace(rank=0, world_size=1,
                          config=SimpleNamespace(reward=SimpleNamespace(weights={"r": 1.0}, aggregation="sum")))
    got = advantages(run, gather_scores(run, batch), clip=100.0)
    std = float(rewards.std(unbiased=False)) + 1e-4
    expected = torch.tensor([1 - 4, 3 - 4, 0, 0, 5 - 4, 7 - 4]) / std  # the mean of "a" is (1 + 3 + 5 + 7) / 4
    assert torch.allclose(got, expected)


def test_one_text_on_two_ranks_shares_one_mean(monkeypatch):
    """Rank 0 and rank 1 each drew "a": the keys are gathered with the rewards, so both groups pool."""
    from solrl_core.data.prompts import text_keys
    from solrl_core.loop import stages

    mine, theirs = torch.tensor([1.0, 3.0]), torch.tensor([5.0, 7.0])
    rank1 = iter([torch.stack([theirs, theirs], dim=1), torch.tensor([1, 1]), torch.tensor(text_keys(["a", "a"]))])
    monkeypatch.setattr(stages.distributed, "all_gather_tensor", lambda t: torch.cat([t, next(rank1)]))
    batch = SimpleNamespace(prompts=["a", "a"], rewards=mine, components={"r": mine}, groups=torch.tensor([0, 0]))
    run = SimpleNamespace(rank=0, world_size=2,
                          config=SimpleNamespace(reward=SimpleNamespace(weights={"r": 1.0}, aggregation="sum")))
    got = stages.advantages(run, stages.gather_scores(run, batch), clip=100.0)
    std = float(torch.tensor([1.0, 3.0, 5.0, 7.0]).std(unbiased=False)) + 1e-4
    assert torch.allclose(got, torch.tensor([-3.0, -1.0, 1.0, 3.0]) / std)


def test_text_keys_do_not_depend_on_the_process():
    """Ranks compare keys after a gather, so a key must not change with Python's per-process hash seed."""
    from solrl_core.data.prompts import text_keys

    keys = text_keys(["a red cube", "a blue ball", "a red cube"])
    assert keys[0] == keys[2] != keys[1] and all(0 <= k < 2**62 for k in keys)
    code = "from solrl_core.data.prompts import text_keys; print(text_keys(['a red cube'])[0])"
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": seed},
                             check=True)
        assert int(out.stdout) == keys[0]


@needs_datasets
def test_a_saved_dataset_trains_the_tiny_model_by_prompts(tmp_path, fast_sets):
    """The tiny model trains two iterations on a dataset folder written by save_to_disk, given by --prompts;
    the dataset is also the eval set, and the in-run rank check shows which prompts were drawn."""
    train = load_prompts("tinyworld_train")[:3]
    datasets.Dataset.from_dict({"caption": train, "id": [0, 1, 2]}).save_to_disk(str(tmp_path / "tinyset"))
    spec = f"{tmp_path / 'tinyset'}:caption"
    sets = [a for s in fast_sets("explore.rank_check_every=1", f"run.eval_prompts={spec}", "run.eval_seeds=1",
                                 "model.resolution=32") for a in ("--set", s)]
    result = runner.invoke(app, ["train", *sets, "--prompts", spec, "--iterations", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    finished = [e for e in events if e["event"] == "iteration"]
    drawn = {e["prompt"] for e in events if e["event"] == "rank_check"}
    evals = [e for e in events if e["event"] == "eval"]
    assert len(finished) == 2 and drawn and drawn <= set(train)
    assert evals and all(e["prompts"] == spec and e["samples"] == 3 for e in evals)
    assert spec in (tmp_path / "run" / "config.toml").read_text()


def _row(output: str, name: str) -> str:
    """The presets table's row of `name`, its wrapped lines joined (the width is the console's, which
    a test run under a worker process does not set)."""
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if f" {name} " in line)
    end = next((j for j in range(at + 1, len(lines)) if lines[j][:1].strip()), len(lines))
    return " ".join(" ".join(lines[at:end]).split())
