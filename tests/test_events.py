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


def test_a_record_that_does_not_fit_says_why():
    with pytest.raises(ev.EventDecodeError, match="unknown event kind 'nope'") as info:
        ev.decode({"event": "nope"})
    assert info.value.kind == "nope"
    good = _instance(ev.CheckpointSaved).to_dict()
    with pytest.raises(ev.EventDecodeError, match="has no field 'extra'"):
        ev.decode({**good, "extra": 1})
    with pytest.raises(ev.EventDecodeError, match="does not fit its fields"):
        ev.decode({k: v for k, v in good.items() if k != "path"})


def test_annotations_are_the_sample_keys():
    """The samples above name every field type the events use (a new type needs a sample)."""
    used = {str(f.type).replace(" | None", "") for cls in ev.event_types().values() for f in dataclasses.fields(cls)}
    assert used <= set(SAMPLES), used - set(SAMPLES)
    assert typing.get_type_hints(ev.RewardStats)  # RewardStats is a plain dataclass the decoder rebuilds
