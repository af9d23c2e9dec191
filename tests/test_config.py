"""Config layering, validation, and every shipped preset."""

import inspect
import itertools

import pytest

from solrl_core.config.convert import from_dict, set_value, to_dict
from solrl_core.config.presets import get_preset, list_presets, names, resolve_config, split_preset_name
from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError

# resolve_config's argument for each kind, in layering order (a later kind overrides an earlier one).
ARGUMENT = {"models": "model", "families": "family", "rewards": "reward"}
DEFAULTS = {kind: inspect.signature(resolve_config).parameters[arg].default for kind, arg in ARGUMENT.items()}


def _settings(values: dict, section: str = "") -> dict[str, object]:
    """A preset's values as {"section.key": value}."""
    out: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, dict) and not section:
            out |= _settings(value, key)
        else:
            out[f"{section}.{key}" if section else key] = value
    return out


@pytest.mark.parametrize("preset", list_presets(), ids=lambda p: f"{p.kind}/{p.name}")
def test_every_shipped_preset_file_resolves_and_validates(preset):
    """Each file resolves and validates with resolve_config's defaults for the other two parts, and
    every setting it makes reaches the config unless a later default part sets it too."""
    where = f"{preset.kind}/{preset.name}"
    assert preset.description, f"{where} has no description for `solrl presets`"
    parts = {ARGUMENT[preset.kind]: preset.name}
    if preset.kind == "rewards" and not _judges(preset.name, video=False):  # a video reward: with a video model
        parts["model"] = "wan21_t2v_1_3b"
    cfg = resolve_config(**parts)
    later = list(ARGUMENT)[list(ARGUMENT).index(preset.kind) + 1:]
    shadowed = {key for kind in later if DEFAULTS[kind] for key in _settings(get_preset(kind, DEFAULTS[kind]).values)}
    resolved = _settings(to_dict(cfg))
    for key, value in _settings(preset.values).items():
        if key not in shadowed:
            assert resolved[key] == value, f"{where} sets {key} = {value!r}, the resolved config has {resolved[key]!r}"
    if preset.kind == "families":
        assert cfg.algorithm.family == preset.name, f"{where} does not set algorithm.family = {preset.name!r}"


def _judges(reward: str, video: bool) -> bool:
    """Whether a reward can judge what a model makes, as the registry declares it."""
    from solrl_core.rewards.registry import lookup

    info = lookup(reward)
    return info is None or (info.media == "video") == video or (video and info.on_frames)


def test_every_combination_of_shipped_presets_resolves_and_validates():
    """Model, family and reward presets are made to combine freely: each combination validates and
    names itself <model>_<family>_<reward>, except a reward that cannot judge what the model makes (a
    still-image reward on a video model), which is refused in one line. All combinations are tried;
    the failing ones are named."""
    parts = {kind: names(kind) for kind in ARGUMENT}
    assert all(parts.values()), f"a preset kind has no files: {parts}"
    failures = []
    video = {model: resolve_config(model).model.frames > 0 for model in parts["models"]}
    for model, family, reward in itertools.product(*parts.values()):
        combination = f"{model}_{family}_{reward}"
        if not _judges(reward, video[model]):  # refused in one line instead (rewards/names.py check_media)
            with pytest.raises(SolrlError, match=f"reward '{reward}' judges"):
                resolve_config(model, family, reward)
            continue
        try:
            cfg = resolve_config(model, family, reward)
            split = split_preset_name(cfg.preset)
        except Exception as exc:  # any error, so that the combination is named with it
            failures.append(f"{combination}: {type(exc).__name__}: {exc}")
            continue
        if cfg.preset != combination or split != (model, family, reward):
            failures.append(f"{combination}: named {cfg.preset!r}, which splits as {split}")
        if cfg.algorithm.family != family:
            failures.append(f"{combination}: algorithm.family is {cfg.algorithm.family!r}")
    assert not failures, f"{len(failures)} combinations fail:\n" + "\n".join(failures)


def test_real_model_presets_carry_the_official_defaults():
    cfg = resolve_config("sana", "sol_rl", "jpeg_compressibility")
    assert (cfg.explore.group_size, cfg.selection.group_size, cfg.explore.steps, cfg.sampler.steps) == (96, 24, 6, 10)
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.optimizer.lr) == (32, 64, 3e-4)
    assert (cfg.algorithm.nft_beta, cfg.algorithm.kl_beta, cfg.run.prompts_per_iteration) == (1.0, 1e-4, 48)
    assert resolve_config("flux1").algorithm.timestep_fraction == 0.4
    assert resolve_config("flux1").model.lora_targets == ("to_q", "to_k", "to_v", "to_out.0")


def test_precedence_preset_then_file_then_set_then_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[optimizer]\nlr = 0.5\nmicro_batch = 3\n[run]\nseed = 4\n")
    cfg = resolve_config("tiny", config_file=f, sets=["optimizer.lr=0.25", "run.seed=5"], flags={"run": {"seed": 6}})
    assert cfg.optimizer.micro_batch == 3  # file over preset
    assert cfg.optimizer.lr == 0.25  # --set over file
    assert cfg.run.seed == 6  # flag over --set


def test_yaml_config_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("selection:\n  group_size: 6\n")
    assert resolve_config("tiny", config_file=f).selection.group_size == 6


def test_round_trip_through_dict():
    cfg = resolve_config("flux1", "naive_quant", "jpeg_incompressibility")
    assert from_dict(to_dict(cfg), Config()) == cfg


@pytest.mark.parametrize("assignment,expect", [
    ("explore.group_size=32", ("explore", "group_size", 32)),
    ("optimizer.lr=1e-5", ("optimizer", "lr", 1e-5)),
    ("model.lora_targets=to_q,to_k", ("model", "lora_targets", ("to_q", "to_k"))),
    ("reward.weights=jpeg_compressibility=1,jpeg_incompressibility=0.5",
     ("reward", "weights", {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.5})),
])
def test_set_parses_each_field_type(assignment, expect):
    section, key, value = expect
    assert getattr(getattr(set_value(Config(), assignment), section), key) == value


@pytest.mark.parametrize("assignment,message", [
    ("explore.group_sise=3", "did you mean 'group_size'"),
    ("explor.steps=3", "did you mean 'explore'"),
    ("explore.group_size=abc", "must be an integer"),
    ("explore.group_size=2.5", "must be an integer"),
    ("optimizer.lr=fast", "must be a number"),
    ("nodot=3", "needs a section"),
    ("explore.steps", "section.key=value"),
])
def test_bad_set_is_a_clear_error(assignment, message):
    with pytest.raises(SolrlError) as err:
        set_value(Config(), assignment)
    assert message in str(err.value)


@pytest.mark.parametrize("sets,message", [
    (["selection.group_size=32"], "more than the N=16"),
    (["selection.group_size=5"], "must be an even number"),
    (["explore.steps=12"], "exceed sampler.steps"),
    (["selection.mode=best"], "unknown selection.mode"),
    (["explore.precision=fp4"], "unknown explore.precision"),
    (["sampler.guidance=4.5"], "not supported"),
])
def test_impossible_configs_are_rejected(sets, message):
    with pytest.raises(SolrlError) as err:
        resolve_config("tiny", sets=sets)
    assert message in str(err.value)


@pytest.mark.parametrize("kwargs,message", [
    ({"model": "tinny"}, "did you mean 'tiny'"),
    ({"family": "solrl"}, "did you mean 'sol_rl'"),
    ({"reward": "jpeg"}, "unknown reward 'jpeg'"),
    ({"preset": "tiny_sol_rl_jpeg"}, "unknown preset"),
])
def test_unknown_presets_suggest_close_matches(kwargs, message):
    with pytest.raises(SolrlError) as err:
        resolve_config(**kwargs)
    assert message in str(err.value)
