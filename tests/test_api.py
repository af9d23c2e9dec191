"""The Python API: `from solrl import train` runs what `solrl train` runs, and resumes."""

from solrl import train
from solrl_core import events as ev
from tests.conftest import FAST


def test_train_from_python_then_resume(tmp_path):
    seen = []
    first = train(sets=FAST, run_dir=tmp_path / "r", iterations=1, on_event=seen.append)
    assert first.finished and first.iteration == 1 and first.run_dir == tmp_path / "r"
    assert (first.run_dir / "checkpoints" / "iter_000001").is_dir()
    assert [type(e) for e in seen] == [type(e) for e in first.events]
    assert [e.iteration for e in first.events if isinstance(e, ev.IterationFinished)] == [1]
    more = train(resume=first.run_dir, iterations=2)
    assert more.finished and more.iteration == 2
    assert [e.iteration for e in more.events if isinstance(e, ev.IterationFinished)] == [2]
