"""Every event survives the JSONL log: encoded as the log writes it, decoded into its own class."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from solrl_core import events as ev

SAMPLES = {"int": 3, "float": 1.5, "str": "text", "bool": True, "dict[str, float]": {"a": 0.25},
           "dict[str, int]": {"a": 2}, "dict[str, Any]": {"a": {"b": [1, 2]}}, "list[float]": [0.5, 0.75],
           "list[int]": [1, 2], "list[str]": ["a", "b"], "dict[str, str]": {"a": "b"},
           "list[dict[str, Any]]": [{"name": "x@2", "recall": 0.5, "rho": None}],
           "RewardStats": ev.RewardStats(mean=0.5, std=0.1, best=0.9, worst=0.1, components={"r": 0.5})}


def _sample(annotation: str) -> object:
    """A value of a field's type, written as the annotation's text (`X | None` takes X)."""
    text = annotation.replace(" | None", "").strip()
    if text not in SAMPLES:
        raise AssertionError(f"no sample value for a field of type {annotation!r}: add one to SAMPLES")
    return SAMPLES[text]


def _instance(cls: type[ev.Event]) -> ev.Event:
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    return cls(**{name: _sample(str(kind)) for name, kind in hints.items()})


def test_every_event_kind_is_found_and_unique():
    kinds = ev.event_types()
    assert {"run_started", "iteration", "eval", "checkpoint", "run_finished", "oom_backoff"} <= set(kinds)
    classes = [c for c in vars(ev).values() if isinstance(c, type) and issubclass(c, ev.Event) and c is not ev.Event]
    assert sorted(c.__name__ for c in kinds.values()) == sorted(c.__name__ for c in classes)


@pytest.mark.parametrize("kind", sorted(ev.event_types()))
def test_each_event_round_trips_through_json(kind):
    event = _instance(ev.event_types()[kind])
    line = json.dumps(event.to_dict())
    assert ev.decode(json.loads(line)) == event


def test_an_unknown_kind_is_told_apart_from_a_damaged_record():
    with pytest.raises(ev.UnknownEventKind, match="unknown event kind 'nope'") as info:
        ev.decode({"event": "nope", "time": 1.0})
    assert info.value.kind == "nope" and isinstance(info.value, ev.EventDecodeError)
    good = _instance(ev.CheckpointSaved).to_dict()
    damaged = {"has no field 'extra'": {**good, "extra": 1},
               "does not fit its fields": {k: v for k, v in good.items() if k != "path"},
               "field 'iteration' should be int, not '3'": {**good, "iteration": "3"},
               "field 'iteration' should be int, not True": {**good, "iteration": True},
               "field 'path' should be str, not None": {**good, "path": None},
               "not an event record": {k: v for k, v in good.items() if k != "event"}}
    for message, record in damaged.items():
        with pytest.raises(ev.EventDecodeError, match=message) as info:
            ev.decode(record)
        assert not isinstance(info.value, ev.UnknownEventKind), message
        assert info.value.kind == (None if "event" not in record else "checkpoint")
    with pytest.raises(ev.EventDecodeError, match="not an event record"):
        ev.decode([1, 2])  # type: ignore[arg-type]


def test_nested_reward_stats_are_checked_and_ints_read_as_floats():
    record = _instance(ev.IterationFinished).to_dict()
    event = ev.decode({**record, "grad_norm": 2, "final": {**record["final"], "std": 0}})
    assert isinstance(event.grad_norm, float) and event.grad_norm == 2.0 and isinstance(event.final.std, float)
    with pytest.raises(ev.EventDecodeError, match="field 'mean' should be float"):
        ev.decode({**record, "final": {**record["final"], "mean": "high"}})
    with pytest.raises(ev.EventDecodeError, match="field 'final' is None, not reward statistics"):
        ev.decode({**record, "final": None})
    assert ev.decode({**record, "draft": None}).draft is None  # RewardStats | None


def test_a_file_written_before_a_field_was_added_still_decodes():
    """Fields added later carry defaults: an older events.jsonl line, lacking them, decodes."""
    record = _instance(ev.IterationFinished).to_dict()
    old = {k: v for k, v in record.items() if k not in ("peak_memory", "memory_source")}
    event = ev.decode(old)
    assert event.peak_memory is None and event.memory_source == "" and event.iteration == record["iteration"]
    started = {k: v for k, v in _instance(ev.RunStarted).to_dict().items() if k not in ("machine", "environment")}
    assert ev.decode(started).environment == {}


def test_annotations_are_the_sample_keys():
    """The samples above name every field type the events use (a new type needs a sample)."""
    used = {str(f.type).replace(" | None", "") for cls in ev.event_types().values() for f in dataclasses.fields(cls)}
    assert used <= set(SAMPLES), used - set(SAMPLES)
    assert typing.get_type_hints(ev.RewardStats)  # RewardStats is a plain dataclass the decoder rebuilds
