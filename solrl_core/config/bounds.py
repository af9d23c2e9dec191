"""The bounds of a config's numbers and settings, checked by Config.validate (config.py). Torch-free,
like the config: a bad value is refused before anything heavy loads."""

from __future__ import annotations

import math
from typing import Any, Callable

from solrl_core.errors import SolrlError, close_matches

# Every bounded number: (low, high, whether low is allowed, whether high is allowed); None = unbounded.
_AT_LEAST_1 = (1, None, True, False)
_AT_LEAST_0 = (0, None, True, False)
_POSITIVE = (0, None, False, False)
_FRACTION = (0, 1, True, False)  # [0, 1)
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    **dict.fromkeys(("sampler.steps", "explore.steps", "run.iterations", "run.prompts_per_iteration",
                     "sampler.rollout_batch", "optimizer.micro_batch", "run.checkpoint_every", "run.keep_checkpoints",
                     "model.lora_rank", "model.resolution", "sampler.eval_steps", "run.eval_every", "run.eval_seeds",
                     "reward.batch_size", "explore.calibrate_prompts", "algorithm.strata",
                     "optimizer.steps_per_iteration"), _AT_LEAST_1),
    **dict.fromkeys(("explore.rank_check_every", "model.quant_min_dim", "run.image_every", "run.threads",
                     "reward.health_patience", "reward.health_min_std", "optimizer.max_nonfinite_steps",
                     "reward.retries",
                     "optimizer.weight_decay", "optimizer.grad_clip", "algorithm.kl_beta", "algorithm.old_decay_rate",
                     "run.seed", "run.min_trade", "model.init_seed", "model.max_sequence_length",
                     "explore.recalibrate_every", "algorithm.awm_anchor_beta", "algorithm.sde_window"), _AT_LEAST_0),
    **dict.fromkeys(("optimizer.lr", "optimizer.eps", "algorithm.nft_beta", "algorithm.adv_clip_max", "sampler.shift",
                     "model.lora_alpha", "algorithm.awm_power", "algorithm.sde_eta", "algorithm.clip_range"),
                    _POSITIVE),
    **dict.fromkeys(("optimizer.beta1", "optimizer.beta2", "algorithm.ema_max_decay"), _FRACTION),
    "algorithm.old_decay_max": (0, 1, True, True),
    "explore.min_recall": (0, 1, True, True),
    "algorithm.timestep_fraction": (0, 1, False, True),
}


def range_text(low: float | None, high: float | None, low_ok: bool, high_ok: bool) -> str:
    """'> 0', '>= 1', 'in [0, 1)' ..."""
    if high is None:
        return f"{'>=' if low_ok else '>'} {low:g}"
    return f"in {'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"


def check_ranges(config: Any, default: Callable[[str, str], Any]) -> None:
    """Each bounded number of `config` lies in its range (NaN and infinity never do). `default(section,
    key)`: the field's default, named in the fix."""
    for name, (low, high, low_ok, high_ok) in RANGES.items():
        section, key = name.split(".")
        value = getattr(getattr(config, section), key)
        inside = (math.isfinite(value) and (low is None or value > low or (low_ok and value == low))
                  and (high is None or value < high or (high_ok and value == high)))
        if not inside:
            raise SolrlError(f"{name}={value:g} is out of range: it must be {range_text(low, high, low_ok, high_ok)}",
                             f"set {name} to a value {range_text(low, high, low_ok, high_ok)} (default "
                             f"{default(section, key):g})")


ON_HACKING = ("warn", "stop", "rollback")  # run.on_hacking (loop/rollback.py)
ROLLBACK_THEN = ("stop", "lower_lr")  # run.rollback_then


def check_hacking(run: Any) -> None:
    """run.on_hacking, run.rollback_then and run.hacking_floors: known choices, and a floor for each
    of the eval rewards it names, finite and >= 0."""
    for name, value, choices in (("run.on_hacking", run.on_hacking, ON_HACKING),
                                 ("run.rollback_then", run.rollback_then, ROLLBACK_THEN)):
        if value not in choices:
            raise SolrlError(f"unknown {name} '{value}'", close_matches(value, choices))
    if run.stop_on_hacking and run.on_hacking not in ("warn", "stop"):
        raise SolrlError(f"run.stop_on_hacking=true (deprecated: on_hacking=stop) contradicts "
                         f"run.on_hacking={run.on_hacking}",
                         "drop run.stop_on_hacking: run.on_hacking says what a run does")
    for name, floor in run.hacking_floors.items():
        if name not in run.eval_rewards:
            raise SolrlError(f"run.hacking_floors names {name}, which is not an eval reward (run.eval_rewards: "
                             f"{', '.join(run.eval_rewards) or 'none'})",
                             close_matches(name, list(run.eval_rewards) or ["none"]))
        if not (math.isfinite(floor) and floor >= 0):
            raise SolrlError(f"run.hacking_floors.{name}={floor:g}: a floor is a finite fall >= 0",
                             f"set it to a fall in {name}'s units, e.g. run.hacking_floors.{name}=0.05")


def check_loss_settings(cfg: Any) -> None:
    """The train timesteps and the SDE window against the steps, the optimizer steps against the samples
    (cfg: a schema.Config)."""
    alg, steps = cfg.algorithm, cfg.sampler.steps
    span = int(steps * alg.timestep_fraction)
    if alg.train_timesteps == "stratified" and alg.strata > span:
        raise SolrlError(f"algorithm.strata={alg.strata} strata over {span} grid steps would repeat timesteps",
                         f"lower algorithm.strata to at most {span}, or raise algorithm.timestep_fraction or "
                         "sampler.steps")
    if alg.loss == "flow_grpo" and alg.sde_window > steps // 2:
        raise SolrlError(f"algorithm.sde_window={alg.sde_window} steps do not fit the first half of "
                         f"sampler.steps={steps}", f"set algorithm.sde_window to at most {steps // 2}, or 0")
    samples = cfg.selection.group_size * cfg.run.prompts_per_iteration
    if cfg.optimizer.steps_per_iteration > samples:
        raise SolrlError(f"optimizer.steps_per_iteration={cfg.optimizer.steps_per_iteration} steps over an iteration's "
                         f"{samples} trained samples", f"set it to at most {samples}")
    if alg.loss == "flow_grpo" and alg.train_timesteps != "subset":
        raise SolrlError("algorithm.loss=flow_grpo trains the steps of its SDE, in order",
                         "drop algorithm.train_timesteps (stratified is AWM's)")
