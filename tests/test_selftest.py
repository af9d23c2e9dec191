"""`solrl doctor --selftest`: the rows chosen per device (a faked sm_90 and sm_100 GPU), --only, and
the whole self-test on this CPU in a real `solrl` process with two planted faults, each one failing
row while the others run (slow: the one whole self-test CI runs; benchmarks/lease.py's test runs two
rows through the same command)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from solrl_core.doctor.selftest import Context, choose, matches
from solrl_core.doctor.selftest_rows import rows
from solrl_core.errors import SolrlError
from solrl_core.precision.hardware import GpuInfo

H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1)
B200 = GpuInfo(0, "NVIDIA B200", (10, 0), 178.4)
CUDA_ONLY = ("explore/fp8", "family/compile", "compile/copies+update", "memory/cpu-whole", "memory/cpu-blocks")


def _reasons(ctx: Context, only: str | None = None) -> dict[str, str | None]:
    return {row.name: reason for row, reason in choose(rows(ctx), ctx, only)}


def test_cuda_only_rows_are_chosen_on_sm_90_and_sm_100_and_skipped_with_their_reason_on_a_cpu(tmp_path):
    torchao_here = lambda: ""  # noqa: E731 - torchao's NVFP4 usable, as on a B200 node with the dev extra
    hopper = _reasons(Context("cuda:0", H100, 1, tmp_path, torchao_missing=torchao_here))
    blackwell = _reasons(Context("cuda:0", B200, 2, tmp_path, torchao_missing=torchao_here))
    cpu = _reasons(Context("cpu", None, 0, tmp_path))
    for name in CUDA_ONLY:
        assert hopper[name] is None and blackwell[name] is None, name
        assert cpu[name], name  # skipped here, with the reason said
    assert "compute capability 9.0 < 10.0" in hopper["explore/nvfp4"]
    assert blackwell["explore/nvfp4"] is None  # real NVFP4 through torchao on compute capability 10.0
    assert "needs 2 or more GPUs, one per process (this machine has 1)" in hopper["fsdp/multi-process"]
    assert blackwell["fsdp/multi-process"] is None  # 2 GPUs: a process on each
    assert "no GPU: FP8 GEMMs" in cpu["explore/fp8"]
    for name in ("tiny-world/sol_rl", "loss/awm", "loss/flow_grpo", "model/sana", "model/flux1", "model/sd3",
                 "model/wan21_t2v_1_3b", "family/naive_scaling",
                 "explore/nvfp4-emulated", "explore/fp8-e5m2-tensor", "rollout-copy", "calibration", "rank-check",
                 "reward-server", "fsdp/1-process"):
        assert cpu[name] is None, (name, cpu[name])  # every row a CPU can run, runs
    assert "no export function given" in cpu["checkpoint+resume+export"]  # the CLI passes `solrl export`'s
    # a precision the user names runs even where the machine lacks it: its refusal is that row's failure
    assert _reasons(Context("cpu", None, 0, tmp_path, precision="fp8"))["explore/fp8"] is None


def test_only_selects_rows_by_glob_or_substring_and_refuses_a_pattern_that_matches_none(tmp_path):
    assert matches("explore/fp8", "explore/*") and matches("explore/fp8", "fp8") and not matches("model/sana",
                                                                                                 "explore/*")
    assert matches("reward-server", "model/sd3,reward")
    ctx = Context("cpu", None, 0, tmp_path)
    assert list(_reasons(ctx, "memory/*")) == ["memory/cpu-whole", "memory/cpu-blocks"]
    with pytest.raises(SolrlError, match="--only nothing-like-this matches no self-test row") as refused:
        choose(rows(ctx), ctx, "nothing-like-this")
    assert "tiny-world/sol_rl" in refused.value.fix


def test_the_selftest_options_are_refused_where_they_mean_nothing():
    from typer.testing import CliRunner

    from solrl_cli.app import app

    for args, said in ((["--selftest", "--json"], "use --json-out PATH"), (["--only", "explore/*"], "--only is for the "
                                                                                                    "self-test"),
                       (["--json-out", "rows.json"], "--json-out is for the self-test")):
        result = CliRunner().invoke(app, ["doctor", *args])
        assert result.exit_code == 2 and said in result.output, (args, result.output)


def _selftest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "300"}
    env.pop("SOLRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "solrl_cli", "doctor", "--selftest", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)


@pytest.mark.slow
def test_the_whole_selftest_runs_every_cpu_row_and_a_planted_fault_is_one_failing_row_while_the_others_run(tmp_path):
    """The whole self-test, once in CI: every row a CPU can run passes but the two planted faults, a
    reward that raises and an explore precision the machine lacks, each one failing row with its fix."""
    (tmp_path / "planted.py").write_text("def score(images, prompts):\n    raise RuntimeError('planted fault')\n")
    out = tmp_path / "rows.json"
    done = _selftest(tmp_path, "--reward", "planted.py:score", "--explore-precision", "fp8", "--json-out", str(out))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows_ = {r["name"]: r for r in json.loads(out.read_text())}
    failed = {name for name, r in rows_.items() if r["status"] == "fail"}
    assert failed == {"explore/fp8", "reward/planted.py:score"}, [(n, rows_[n]["detail"]) for n in failed]
    assert "explore precision fp8 does not run on the CPU" in rows_["explore/fp8"]["detail"]
    assert "use --explore-precision nvfp4-emulated" in rows_["explore/fp8"]["fix"]
    assert "planted fault" in rows_["reward/planted.py:score"]["detail"] and rows_["reward/planted.py:score"]["fix"]
    skipped = {name for name, r in rows_.items() if r["status"] == "skipped"}
    assert skipped == {*CUDA_ONLY, "explore/nvfp4", "fsdp/multi-process"} - {"explore/fp8"}
    assert all(r["detail"] for name, r in rows_.items() if name in skipped)  # each with its reason
    assert {"tiny-world/sol_rl", "model/wan21_t2v_1_3b", "checkpoint+resume+export", "reward-server", "fsdp/1-process",
            "calibration", "rank-check", "rollout-copy"} <= set(rows_) - failed - skipped
    assert all(r["seconds"] >= 0 and (r["status"] == "skipped" or r["peak_gib"] > 0) for r in rows_.values())
    text = done.stdout
    assert "Traceback" not in text + done.stderr
    # a line per row as it ends, in order, each row said once (no table repeating them)
    said = re.findall(r"^\[(\d+)\] (\w+) +[\d.]+ s +(?:[\d.]+ GiB +)?(\S+?)(?:: |$)", text, flags=re.M)
    assert [(int(n), name) for n, _, name in said] == list(enumerate(rows_, 1)), text
    assert all(status == rows_[name]["status"] for _, status, name in said)
    assert f"{len(rows_) - len(failed) - len(skipped)} pass, 2 fail, {len(skipped)} skipped" in text
