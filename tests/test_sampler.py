import pytest
import torch

from solrl_core.engine.sampler import noise_for_seeds, sample, sigma_grid


def test_noise_is_a_pure_function_of_the_seed():
    a = noise_for_seeds([5, 7, 9], (3, 4, 4), torch.device("cpu"))
    b = noise_for_seeds([9, 5], (3, 4, 4), torch.device("cpu"))
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1])


def test_sigma_grid_is_linspace_and_shift_keeps_ends():
    assert torch.allclose(sigma_grid(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    shifted = sigma_grid(4, shift=3.0)
    assert shifted[0] == 1.0 and shifted[-1] == 0.0 and torch.isclose(shifted[2], torch.tensor(0.75))


def test_euler_recovers_x0_for_the_exact_velocity():
    x0 = torch.randn(2, 3, 4, 4)
    noise = torch.randn(2, 3, 4, 4)
    out = sample(lambda x, s, c: noise - x0, noise, None, sigma_grid(5))  # straight-line flow
    assert torch.allclose(out, x0, atol=1e-5)


@pytest.mark.parametrize("kind", ["linspace", "scheduler", "qwen_image"])
def test_every_grid_is_finite_at_one_step(kind):
    # One preview step (explore.steps=1) is allowed; Qwen-Image's stretch to its terminal sigma divides
    # 0 by 0 there, and every Stage-1 image came out NaN.
    grid = sigma_grid(1, 3.0, kind)
    assert torch.isfinite(grid).all() and grid[0] == 1.0 and grid[-1] == 0.0 and grid.numel() == 2
