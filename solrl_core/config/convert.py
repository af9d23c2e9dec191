"""Reading and writing a run configuration: plain dicts for TOML/JSON, `--set section.key=value`
overrides parsed for each field's type, and the help table of every setting. The schema and its
cross-field rules are in config.py."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from solrl_core.config.schema import _SECTION_TYPES, Config
from solrl_core.errors import SolrlError, close_matches
from solrl_core.faults.links import check_tree
from solrl_core.io.atomic import write_atomic
from solrl_core.io.rundir import CONFIG_FILE, check_run_folder


def to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict (tuples become lists) for TOML/JSON."""
    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


def from_dict(data: dict[str, Any], base: Config | None = None, source: str = "config") -> Config:
    """Overlay a nested dict on `base`, checking every key and type. Unknown keys are errors."""
    config = base or Config()
    updates: dict[str, Any] = {}
    for key, value in data.items():
        if key == "preset":
            updates["preset"] = _coerce(str, value, "preset", source)
            continue
        if key not in _SECTION_TYPES:
            raise SolrlError(f"unknown config section '{key}' in {source}",
                             close_matches(key, list(_SECTION_TYPES) + ["preset"]))
        if not isinstance(value, dict):
            raise SolrlError(f"'{key}' in {source} must be a table of settings", f"write it as [{key}] with key = "
                                                                                 f"value lines")
        section = getattr(config, key)
        updates[key] = _overlay_section(section, value, key, source)
    return dataclasses.replace(config, **updates)


def _overlay_section(section: Any, values: dict[str, Any], prefix: str, source: str) -> Any:
    hints = typing.get_type_hints(type(section))
    names = [f.name for f in fields(section)]
    changes = {}
    for name, raw in values.items():
        if name not in names:
            raise SolrlError(f"unknown setting '{prefix}.{name}' in {source}", close_matches(name, names))
        changes[name] = _coerce(hints[name], raw, f"{prefix}.{name}", source)
    return dataclasses.replace(section, **changes)


def set_value(config: Config, assignment: str) -> Config:
    """Apply one `section.key=value` override (value parsed for the field's type)."""
    if "=" not in assignment:
        raise SolrlError(f"--set '{assignment}' is not of the form section.key=value", "example: --set "
                                                                                       "explore.group_size=32")
    path, text = assignment.split("=", 1)
    path = path.strip()
    if "." not in path:
        raise SolrlError(f"--set '{path}' needs a section",
                         "example: --set optimizer.lr=1e-4; sections: " + ", ".join(_SECTION_TYPES))
    section, key = path.split(".", 1)
    if section not in _SECTION_TYPES:
        raise SolrlError(f"unknown config section '{section}' in --set {assignment}",
                         close_matches(section, list(_SECTION_TYPES)))
    names = [f.name for f in fields(_SECTION_TYPES[section])]
    hints = typing.get_type_hints(_SECTION_TYPES[section])
    entry = None
    if key not in names and "." in key and typing.get_origin(hints.get(key.split(".", 1)[0])) is dict:
        key, entry = key.split(".", 1)  # section.table.entry=value sets one entry of a table
    if key not in names:
        raise SolrlError(f"unknown setting '{path}' in --set", close_matches(key, names))
    hint = hints[key]
    if entry is not None:
        value = {**getattr(getattr(config, section), key),
                 entry: _coerce(typing.get_args(hint)[1], text.strip(), path, "--set")}
        return from_dict({section: {key: value}}, config, source="--set")
    return from_dict({section: {key: _parse_text(hint, text.strip(), path)}}, config, source="--set")


def _parse_text(hint: Any, text: str, name: str) -> Any:
    """Turn the text of a --set value into the field's type."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if origin is dict:
        value_type = typing.get_args(hint)[1]
        out: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, _, w = part.partition("=")
            out[k.strip()] = _coerce(value_type, w or ("1.0" if value_type is float else ""), name, "--set")
        return out
    if hint is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise SolrlError(f"--set {name}={text}: expected true or false", f"--set {name}=true")
    return _coerce(hint, text, name, "--set")


def _coerce(hint: Any, value: Any, name: str, source: str) -> Any:
    """Check/convert one value to the field's type; a wrong type is a clear error."""
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise TypeError
            return tuple(str(v) for v in value)
        if origin is dict:
            if not isinstance(value, dict):
                raise TypeError
            value_type = typing.get_args(hint)[1]
            return {str(k): _coerce(value_type, v, f"{name}.{k}", source) for k, v in value.items()}
        if hint is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if hint is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if hint is str:
            if isinstance(value, bool):  # an auto/true/false switch that an older config wrote as a TOML bool
                return "true" if value else "false"
            if not isinstance(value, (str, int, float)):
                raise TypeError
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        raise AssertionError(f"unsupported config type {hint!r}")
    kind = {int: "an integer", float: "a number", str: "text", bool: "true or false"}.get(hint, _type_name(hint))
    raise SolrlError(f"{name}={value!r} in {source} must be {kind}", f"fix the value of {name}")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list of names (comma-separated with --set)"
    if origin is dict:
        return "a table name = value (NAME=V,NAME=V with --set)"
    return str(hint)


def help_table(config: Config | None = None, match: str = "") -> list[tuple[str, str, str]]:
    """(key, value, help) for each setting whose key holds `match` (any case; '' for all), for `solrl
    config-help`: the value `config` holds (a resolved preset's), its help naming the built-in default
    where the two differ; without a config, the built-in defaults."""
    rows = []
    for section, cls in _SECTION_TYPES.items():
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            value = getattr(getattr(config, section), f.name) if config is not None else default
            note = f" (built-in default: {default!r})" if value != default else ""
            rows.append((f"{section}.{f.name}", repr(value), f.metadata.get("help", "") + note))
    chosen = [row for row in rows if match.lower() in row[0].lower()]
    if not chosen:
        words = sorted({part for key, _, _ in rows for part in key.split(".")})
        raise SolrlError(f"no setting's key holds '{match}'",
                         f"{close_matches(match, words)} (a section such as explore, or part of a key); "
                         "`solrl config-help` alone lists every setting")
    return chosen


def load_run_config(run_dir: str | Path) -> Config:
    """The resolved config saved in a run directory (for --resume, eval and infer), once the folder
    holds no link out of it and no special file (faults/links.py): every command that opens a run folder reads this
    first."""
    path = check_run_folder(run_dir)
    check_tree(path)
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise SolrlError(f"{path} is not a solrl run directory (no {CONFIG_FILE})", "pass the folder a previous `solrl "
                                                                                    "train` wrote")
    try:
        data = tomllib.loads(cfg_file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SolrlError(f"{cfg_file} is corrupt: {exc}", "restore it, or start a new run") from exc
    return from_dict(data, Config(), source=str(cfg_file)).validate()


def save_run_config(run_dir: Path, config: Config) -> None:
    """The run's resolved config, read back by --resume, eval and infer (and rewritten when an
    out-of-memory back-off changes a batch size)."""
    write_atomic(run_dir / CONFIG_FILE, tomli_w.dumps(to_dict(config)))


FIXED_BY_CHECKPOINT = ("lora_rank", "lora_alpha", "lora_targets")  # the adapters' shape and scale


def check_resume_overrides(saved: Config, resumed: Config, run_dir: str | Path) -> None:
    """A resume's `--set` may not change what the checkpoints' adapters fix: name the flag, not
    config.toml, and the value the run was saved with."""
    for key in FIXED_BY_CHECKPOINT:
        before, after = getattr(saved.model, key), getattr(resumed.model, key)
        if before != after:
            shown = ",".join(before) if isinstance(before, tuple) else before
            raise SolrlError(f"--set model.{key} cannot change a resumed run: the adapters in {run_dir}'s checkpoints "
                             f"were trained with model.{key} = {shown}",
                             f"drop --set model.{key}, or start a new run to train with another value")
