"""One engine (engine.py): every command generates through `Engine.generate`, and the side tools
generate on the very network training does."""

import re
from pathlib import Path

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.engine.engine import open_engine
from solrl_core.loop.session import open_session
from solrl_core.rewards import RewardSet
from tests.conftest import FAST

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = re.compile(r"\bmodel\.decode\(|\bsampler\.generate\(|Sampler\.of\([^)]*\)\.generate\(|\bsample\(")


def test_only_the_engine_samples_and_decodes():
    """A second place that runs the sampler or the VAE is where behaviour starts to disagree."""
    found = []
    for path in sorted((ROOT / "solrl_core").rglob("*.py")) + sorted((ROOT / "solrl_cli").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("solrl_core/engine/engine.py",
                   "solrl_core/engine/sampler.py") or rel.startswith("solrl_core/models/"):
            continue
        found += [f"{rel}:{i}" for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                  if SAMPLING.search(line)]
    assert not found, f"sampling or decoding outside engine.py: {found}"


def test_the_check_would_see_a_second_generate_site():
    assert SAMPLING.search("    latents = Sampler.of(cfg.sampler).generate(model, net, cond, seeds, steps, dtype)")
    assert SAMPLING.search("    images = run.model.decode(latents)")


def test_an_unknown_network_is_named():
    engine = open_engine(resolve_config("tiny_random", "sol_rl", sets=list(FAST)))
    with pytest.raises(ValueError, match="unknown network 'draft'"):
        engine.generate(engine.conditioning(["a red circle"]), torch.tensor([1]), 2, "draft")


def test_explore_without_an_explore_copy_is_the_full_precision_rollout():
    cfg = resolve_config("tiny_random", "sol_rl", sets=list(FAST))
    seeds, prompts = torch.tensor([3, 4]), ["a red circle", "a blue square"]
    plain = open_engine(cfg)
    cond = plain.conditioning(prompts)
    assert torch.equal(plain.generate(cond, seeds, 3, "explore").images,
                       plain.generate(cond, seeds, 3, "rollout").images)
    low = open_engine(cfg, explore=True)
    assert low.explore_copy is not None and low.explore_copy.precision == "nvfp4-emulated"
    assert not torch.equal(low.generate(cond, seeds, 3, "explore").images,
                           low.generate(cond, seeds, 3, "rollout").images)


@pytest.mark.slow
def test_the_side_tools_generate_on_the_network_training_generates_on(tmp_path):
    """`solrl explore` and `solrl rank-check` open their engine with open_engine(explore=True): its
    explore and rollout networks give, seed for seed, the images a training session's give."""
    cfg = resolve_config("tiny", "sol_rl", sets=[*FAST, f"run.run_dir={tmp_path / 'run'}", "run.eval_prompts="])
    trained = open_session(cfg).run.engine
    tool = open_engine(cfg, explore=True, rewards=RewardSet.from_config(cfg.reward, torch.device("cpu")))
    seeds, prompts = torch.tensor([11, 12, 13]), ["a red circle", "two blue squares", "a green triangle"]
    for on, steps in (("explore", cfg.explore.steps), ("rollout", cfg.sampler.steps)):
        a = trained.generate(trained.conditioning(prompts), seeds, steps, on, to_cpu=False).images.cpu()
        b = tool.images(prompts, seeds, steps, on)
        assert torch.equal(a, b), on
