"""Disks and filesystems: a full disk, a read-only folder, no flock, a kill during a save or an append.

Where the machine lets an unprivileged user namespace mount a tmpfs (`unshare -rm`), the full and
read-only filesystems are real ones and the run goes through the CLI; elsewhere those tests skip and
the unit tests below raise the exception types the libraries really raise."""

import errno
import json
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine import checkpoint as ckpt
from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.faults import lock as lock_module
from solrl_core.faults.lock import RunLock
from solrl_core.tracking.compare import load_run
from tests.conftest import FAST
from tests.helpers import in_tmpfs as _in_tmpfs, of_kind as _of, record_events as _record, train_or_error as _train

ROOT = Path(__file__).resolve().parents[1]


def _train_cmd(run_dir: Path, *extra: str) -> str:
    sets = " ".join(f"--set {s}" for s in (*FAST, "run.eval_prompts=", *extra))
    return f"{sys.executable} -m solrl_cli train --run-dir {run_dir} {sets}"


def test_a_real_full_disk_stops_the_cli_clearly_and_keeps_the_previous_checkpoint(tmp_path):
    mount = tmp_path / "small"
    run_dir = mount / "run"
    check = (f"{sys.executable} -c \"from solrl_core.faults.manifest import verify; import pathlib; "
             f"c = pathlib.Path('{run_dir}/checkpoints'); print('LEFT', sorted(p.name for p in c.iterdir())); "
             f"print('VERIFY', verify(c / 'iter_000001'))\"")
    done = _in_tmpfs(mount, f"{_train_cmd(run_dir, 'run.iterations=2', 'run.checkpoint_every=1')}; echo RC=$?; {check}")
    out = done.stdout + done.stderr
    assert "RC=2" in done.stdout, out[-3000:]
    assert "internal error" not in out
    assert f"error: the disk is full: checkpoint iter_000002 could not be written to {run_dir}/checkpoints (" in out
    assert "free on that filesystem); the previous checkpoint iter_000001 is intact" in out
    assert "LEFT ['iter_000001']" in done.stdout  # the half-written folder is gone
    assert "VERIFY None" in done.stdout
    assert "continues from iter_000001" in out, out


def test_a_real_read_only_run_folder_is_one_clear_line(tmp_path):
    mount = tmp_path / "ro"
    done = _in_tmpfs(mount, f"mount -o remount,ro {mount} && {_train_cmd(mount / 'run', 'run.iterations=1')}; echo "
                            f"RC=$?")
    out = done.stdout + done.stderr
    assert "RC=2" in done.stdout, out[-3000:]
    assert "internal error" not in out
    assert f"error: {mount} is on a read-only filesystem: the run folder run could not be written" in out
    assert "--run-dir" in out


# ---------------------------------------------------------------- the exceptions libraries really raise


def _torch_full() -> RuntimeError:
    """What torch.save into a file object raises on a full disk: a RuntimeError whose context is ENOSPC."""
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    except RuntimeError as exc:
        return exc


FULL = [_torch_full(), SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded")]


def test_a_full_disk_is_recognised_whatever_raises_it():
    assert all(disk.disk_full(exc) for exc in FULL)
    assert not disk.disk_full(RuntimeError("unexpected pos 576 vs 534")) and not disk.disk_full(ValueError("bad"))
    assert disk.read_only(OSError(errno.EROFS, "Read-only file system")) == errno.EROFS
    assert disk.read_only(PermissionError(errno.EACCES, "Permission denied")) == errno.EACCES


@pytest.mark.parametrize("exc", FULL[:2], ids=["torch", "safetensors"])
def test_a_checkpoint_save_on_a_full_disk_removes_its_folder_and_names_the_free_space(tmp_path, monkeypatch, exc):
    (tmp_path / "checkpoints" / "iter_000001").mkdir(parents=True)

    def write(tmp, *args):
        (tmp / "optimizer.safetensors").write_bytes(b"half")
        raise exc

    monkeypatch.setattr(ckpt, "_write", write)
    with pytest.raises(SolrlError) as raised:
        ckpt.save_checkpoint(tmp_path, 2, None, None, {}, keep=2)
    message = raised.value.message
    assert message.startswith(f"the disk is full: checkpoint iter_000002 could not be written to "
                              f"{tmp_path / 'checkpoints'} (")
    assert "free on that filesystem); the previous checkpoint iter_000001 is intact" in message
    assert "--resume" in raised.value.fix
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]


def test_the_rename_of_a_checkpoint_into_place_is_synced(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(ckpt, "_write", lambda tmp, *args: (tmp / "f").write_text("x"))
    monkeypatch.setattr(disk, "fsync_dir", lambda folder: synced.append((folder, (folder / "iter_000003").is_dir())))
    ckpt.save_checkpoint(tmp_path, 3, None, None, {}, keep=2)
    assert synced == [(tmp_path / "checkpoints", True)]


class _FullFile:
    def __init__(self, fh):
        self.fh = fh

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.fh.close()


def test_a_full_disk_under_events_jsonl_is_clear_and_claims_no_checkpoint(fast_sets, monkeypatch):
    real = ev.JsonlLog.__call__

    def call(self, event):
        if isinstance(event, ev.IterationFinished):
            self._fh = _FullFile(self._fh)
        return real(self, event)

    monkeypatch.setattr(ev.JsonlLog, "__call__", call)
    failed, seen = _train(fast_sets("run.eval_prompts=", "run.iterations=1"))
    assert isinstance(failed, SolrlError), failed
    assert failed.message.startswith("the disk is full: events.jsonl could not be written to ")
    end = _of(seen, ev.RunFinished)[0]
    assert end.reason == "failed" and end.checkpoint is None  # nothing was saved, and nothing claims it was


# ---------------------------------------------------------------- locks


def test_a_filesystem_without_flock_names_the_opt_out(tmp_path, monkeypatch):
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_module.fcntl, "flock", flock)
    with pytest.raises(SolrlError) as raised:
        RunLock.acquire(tmp_path)
    assert "does not support file locks (flock: ENOLCK)" in raised.value.message
    assert "run.lock=false" in raised.value.fix and "nothing stops two runs" in raised.value.fix
    assert not RunLock.acquire(tmp_path, enabled=False).held  # the opt-out takes no lock
    assert resolve_config("tiny", sets=["run.lock=false"]).run.lock is False


# ---------------------------------------------------------------- a kill during a save or an append


def test_an_orphaned_save_is_removed_when_the_run_is_resumed(fast_sets):
    sets = fast_sets("run.eval_prompts=", "run.iterations=1")
    first, _ = _train(sets)
    orphan = first.run.run_dir / "checkpoints" / ".tmp-iter_000002-123-456"
    orphan.mkdir()
    (orphan / "optimizer.safetensors").write_bytes(b"half")
    resumed, seen = _train(fast_sets("run.eval_prompts=", "run.iterations=2"), resume=True)
    assert not orphan.exists()
    assert any(".tmp-iter_000002-123-456" in w.message and "interrupted by a kill" in w.message
               for w in _of(seen, ev.RunWarning))


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_append_starts_a_new_line(tmp_path):
    _record(tmp_path, "sol_rl", [0.5, 0.6], seconds=1.0)
    path = tmp_path / "events.jsonl"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"event": "iteration", "iter')  # a kill mid-write
    run = load_run(tmp_path)
    assert len(run.iterations) == 2 and run.warnings == [f"{path} line 6 skipped: torn by a kill mid-write (not JSON)"]
    log = ev.JsonlLog(path)  # a resumed run appends
    log(ev.RunWarning(message="resumed"))
    log.close()
    assert json.loads(path.read_text().splitlines()[-1])["message"] == "resumed"
    with pytest.raises(SolrlError, match="line 6 is damaged: not JSON"):  # torn, then not a resume: damage, refused
        load_run(tmp_path)


def test_a_torn_line_before_a_resume_is_skipped_and_damage_in_the_middle_is_refused(tmp_path):
    _record(tmp_path, "sol_rl", [0.5, 0.6, 0.7], seconds=1.0, resume_at=1)
    path = tmp_path / "events.jsonl"
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"resumed": true' in line)
    lines[at - 1] = lines[at - 1][:30]  # the iteration the kill cut short, then the resume's run_started
    path.write_text("\n".join(lines) + "\n")
    assert [t.event.iteration for t in load_run(tmp_path).iterations] == [1, 2, 3]
    lines[1] = lines[1][:20]  # the same damage where no resume follows
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SolrlError, match="line 2 is damaged: not JSON"):
        load_run(tmp_path)
