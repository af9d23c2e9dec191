"""Exact-number tests of the NVFP4 emulation, and agreement with torchao's NVFP4Tensor."""

from __future__ import annotations

import pytest
import torch

from solrl_core.precision.nvfp4 import (
    BLOCK,
    E2M1_VALUES,
    E4M3_MAX,
    FP4_MAX,
    fake_quantize_1d,
    fake_quantize_2d,
    global_scale,
    round_to_e2m1,
)

FLT_MAX = torch.finfo(torch.float32).max


def test_constants() -> None:
    assert E2M1_VALUES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert (FP4_MAX, E4M3_MAX, BLOCK) == (6.0, 448.0, 16)


def test_e2m1_ties_go_to_even_mantissa() -> None:
    # Each tie sits between an even code (mantissa bit 0) and an odd one; the even one wins:
    # 0.25: 0 | 0.5 -> 0     0.75: 0.5 | 1 -> 1     1.25: 1 | 1.5 -> 1     1.75: 1.5 | 2 -> 2
    # 2.5: 2 | 3 -> 2        3.5: 3 | 4 -> 4        5: 4 | 6 -> 4
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])
    assert torch.equal(round_to_e2m1(ties), expected)
    assert torch.equal(round_to_e2m1(-ties), -expected)


def test_e2m1_hand_vectors() -> None:
    x = torch.tensor(
        [0.0, 0.1, 0.26, 0.5, 0.74, 0.9, 1.3, 1.6, 1.8, 2.4, 2.6, 3.4, 3.6, 4.9, 5.1, 6.0]
    )
    expected = torch.tensor(
        [0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.5, 1.5, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 6.0, 6.0]
    )
    assert torch.equal(round_to_e2m1(x), expected)
    assert torch.equal(round_to_e2m1(-x), -expected)
    # Small negatives keep their sign, as TE's code 8 (-0.0).
    assert torch.signbit(round_to_e2m1(torch.tensor([-0.1]))).item()


def test_e2m1_one_ulp_off_each_tie_rounds_to_nearest() -> None:
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    above = torch.nextafter(ties, torch.tensor(7.0))
    below = torch.nextafter(ties, torch.tensor(0.0))
    assert torch.equal(round_to_e2m1(above), torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]))
    assert torch.equal(round_to_e2m1(below), torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]))


def _nearest_e2m1_brute_force(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value by distance to all eight; on a tie the even code (index) wins."""
    values = torch.tensor(E2M1_VALUES)
    dist = (x.abs().unsqueeze(-1) - values).abs()
    best = dist.min(dim=-1, keepdim=True).values
    # Among the nearest, prefer the even index: give odd indices a penalty that breaks ties only.
    odd = (torch.arange(8) % 2).to(dist.dtype)
    idx = torch.where(dist == best, odd, torch.full_like(dist, 2.0)).argmin(dim=-1)
    return torch.copysign(values[idx], x)


def test_e2m1_matches_brute_force_on_dense_grid() -> None:
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x = torch.cat([torch.linspace(-6.0, 6.0, 96_001), ties, -ties])
    assert torch.equal(round_to_e2m1(x), _nearest_e2m1_brute_force(x))


def test_e2m1_matches_torchao() -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, f32_to_f4_unpacked

    grid = torch.linspace(-6.0, 6.0, 96_001)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x = torch.cat([grid, ties, -ties, torch.nextafter(ties, torch.tensor(7.0))])
    assert torch.equal(round_to_e2m1(x), f4_unpacked_to_f32(f32_to_f4_unpacked(x)))


def test_global_scale() -> None:
    amax = torch.tensor([0.0, 2688.0, 6.0, 10.5, float("inf"), 1e-40])
    # 2688/2688 = 1; 2688/6 = 448; 2688/10.5 = 256; amax 0 or inf -> 1; overflow -> FLT_MAX
    expected = torch.tensor([1.0, 1.0, 448.0, 256.0, 1.0, FLT_MAX])
    assert torch.equal(global_scale(amax), expected)


def test_fake_quantize_1d_hand_computed() -> None:
    # Two blocks of 16. amax = 10.5, so S_enc = 2688 / 10.5 = 256 (exact).
    # Block 0, vmax = 10.5: s = e4m3(10.5 * 256 / 6) = e4m3(448) = 448, so q = rne(x / 1.75)
    #   and x_hat = q * 448 / 256 = q * 1.75.
    #   10.5 -> 6 -> 10.5     -7 -> -4 -> -7     5 -> 2.857 -> 3 -> 5.25    1 -> .571 -> .5 -> .875
    #   0.3 -> .171 -> 0      -2.2 -> -1.257 -> -1.5 -> -2.625 (just past the 1.25 tie)
    #   3 -> 1.714 -> 1.5 -> 2.625 (just short of the 1.75 tie)   9 -> 5.14 -> 6 -> 10.5
    #   -0.5 -> -.286 -> -.5 -> -.875    4.2 -> 2.4 -> 2 -> 3.5   0 -> 0
    #   6.4 -> 3.657 -> 4 -> 7           -1.6 -> -.914 -> -1 -> -1.75   2 -> 1.143 -> 1 -> 1.75
    #   -10 -> -5.714 -> -6 -> -10.5     0.8 -> .457 -> .5 -> .875
    # Block 1, vmax = 2: 2 * 256 / 6 = 85.33, whose nearest E4M3 is 88 (80 and 88 are the
    #   neighbours, step 8 in [64, 128)), so q = rne(x * 256 / 88) = rne(x * 2.909)
    #   and x_hat = q * 88 / 256 = q * 0.34375. The block's own max does not survive: 2 -> 2.0625.
    #   2 -> 5.818 -> 6 -> 2.0625     1 -> 2.909 -> 3 -> 1.03125    0.5 -> 1.455 -> 1.5 -> .515625
    #   -0.3 -> -.873 -> -1 -> -.34375   0.1 -> .291 -> .5 -> .171875   0.05 -> .145 -> 0 -> 0
    #   1.3 -> 3.782 -> 4 -> 1.375    -1.7 -> -4.945 -> -4 -> -1.375   1.75 -> 5.091 -> 6 -> 2.0625
    #   -2 -> -6 -> -2.0625    0.7 -> 2.036 -> 2 -> .6875    -0.9 -> -2.618 -> -3 -> -1.03125
    #   1.5 -> 4.364 -> 4 -> 1.375   0.2 -> .582 -> .5 -> .171875   0 -> 0   -0.12 -> -.349 -> -.5
    x = torch.tensor(
        [10.5, -7.0, 5.0, 1.0, 0.3, -2.2, 3.0, 9.0, -0.5, 4.2, 0.0, 6.4, -1.6, 2.0, -10.0, 0.8]
        + [2.0, 1.0, 0.5, -0.3, 0.1, 0.05, 1.3, -1.7, 1.75, -2.0, 0.7, -0.9, 1.5, 0.2, 0.0, -0.12]
    )
    q0 = [6, -4, 3, 0.5, 0, -1.5, 1.5, 6, -0.5, 2, 0, 4, -1, 1, -6, 0.5]
    q1 = [6, 3, 1.5, -1, 0.5, 0, 4, -4, 6, -6, 2, -3, 4, 0.5, 0, -0.5]
    expected = torch.tensor([q * 1.75 for q in q0] + [q * 0.34375 for q in q1])
    assert torch.equal(fake_quantize_1d(x), expected)
    # The same numbers as a [2, 16] activation: blocks per row, one global scale.
    assert torch.equal(fake_quantize_1d(x.view(2, 16)), expected.view(2, 16))


def test_fake_quantize_1d_zero_tensor_and_zero_block() -> None:
    zeros = torch.zeros(3, 32)
    out = fake_quantize_1d(zeros)
    assert torch.equal(out, zeros)
    x = torch.cat([torch.linspace(-3.0, 3.0, 16), torch.zeros(16)])
    out = fake_quantize_1d(x)
    assert torch.equal(out[16:], torch.zeros(16))
    assert torch.isfinite(out).all()


def test_fake_quantize_1d_block_scale_underflow_gives_zero() -> None:
    # amax = 1e4: S_enc = 0.2688; the second block's scale 1e-6 * 0.2688 / 6 = 4.5e-8 is below
    # half the smallest E4M3 subnormal (2^-10), so it rounds to 0 and the block dequantizes to 0.
    x = torch.cat([torch.full((16,), 1e4), torch.full((16,), 1e-6)])
    out = fake_quantize_1d(x)
    assert torch.equal(out[:16], torch.full((16,), 1e4))
    assert torch.equal(out[16:], torch.zeros(16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_fake_quantize_keeps_dtype_and_computes_in_float32(dtype: torch.dtype) -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = fake_quantize_1d(x)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, fake_quantize_1d(x.float()).to(dtype))
    w = x.reshape(16, 16)
    assert torch.equal(fake_quantize_2d(w), fake_quantize_2d(w.float()).to(dtype))


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="divisible by 16"):
        fake_quantize_1d(torch.randn(4, 24))
    with pytest.raises(ValueError, match="divisible by 16"):
        fake_quantize_2d(torch.randn(16, 24))
    with pytest.raises(ValueError, match="2D"):
        fake_quantize_2d(torch.randn(16, 16, 16))
    with pytest.raises(TypeError):
        fake_quantize_1d(torch.ones(16, dtype=torch.int32))


def test_fake_quantize_2d_equals_per_tile_loop() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g) * torch.exp(torch.randn(48, 1, generator=g))
    w[16:32, 32:48] = 0.0  # one all-zero tile
    s_enc = global_scale(w.abs().amax())
    expected = torch.empty_like(w)
    for i in range(0, 48, 16):
        for j in range(0, 64, 16):
            tile = w[i : i + 16, j : j + 16].flatten()
            # The 1D formula with vmax = the whole tile's amax and the tensor's global scale.
            s = torch.clamp(tile.abs().amax() * (s_enc * (1 / 6)), max=448.0)
            s = s.to(torch.float8_e4m3fn).float()
            if s == 0:
                expected[i : i + 16, j : j + 16] = 0.0
                continue
            q = round_to_e2m1(torch.clamp(tile * (1.0 / (s * (1.0 / s_enc))), -6.0, 6.0))
            expected[i : i + 16, j : j + 16] = (q * s / s_enc).view(16, 16)
    assert torch.equal(fake_quantize_2d(w), expected)


def test_fake_quantize_2d_is_transpose_invariant() -> None:
    w = torch.randn(32, 80, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fake_quantize_2d(w).T, fake_quantize_2d(w.T))


def test_e4m3_scale_tie_follows_te_operation_order() -> None:
    # amax = 3, so S_enc = 2688 / 3 = 896 (exact). Block 1 has vmax = 0.5625 = 3 * 3/16, whose
    # block scale is, in real numbers, 0.5625 * 896 / 6 = 84: the midpoint of the E4M3 values 80
    # and 88. TE's kernel order computes 0.5625 * (896 * float32(1/6)) = 84.0000076 in float32
    # (float32(1/6) is above 1/6 and 896 * it rounds up), so E4M3 gives 88. torchao's order
    # ((0.5625 / 6) / (3 / 2688)) and the left-to-right formula (0.5625 * 896 / 6 = 84 exactly,
    # ties to even) give 80. We follow TE, whose CUDA kernel uses this order.
    # Block 1: q = rne(0.5625 * 896 / 88) = rne(5.73) = 6, x_hat = 6 * 88 / 896 = 528 / 896.
    x = torch.tensor([3.0] * 16 + [0.5625] * 16)
    expected = torch.cat([torch.full((16,), 3.0), torch.full((16,), 528.0) / 896.0])
    assert torch.equal(fake_quantize_1d(x), expected)


# torchao's NVFP4Tensor is an independent implementation (its own bit-level E2M1 rounding and
# operation order). Conventions, from torchao/prototype/mx_formats/nvfp4_tensor.py (0.18):
# - its `per_tensor_scale` is a *decode* scale, amax / (448 * 6) (`per_tensor_amax_to_scale`),
#   the reciprocal of our S_enc;
# - block scale e4m3((vmax / 6) / per_tensor_scale), scaled value x * ((1 / per_tensor_scale) / s).
#   Both round to nearest even, like TE, but these float32 orders differ from TE's (which we
#   follow). They disagree only where the value being rounded is, in exact arithmetic, a tie:
#   vmax / amax * 448 the midpoint of two E4M3 values, or x * 2688 / (amax * s) the midpoint of
#   two E2M1 values; each order then lands a float32 ulp off the tie, on either side. Random
#   float32 data has no such ties (all codes and scales equal); bfloat16 data, with 8-bit
#   mantissas, has a few, and the test proves that every disagreement is one;
# - it dequantizes as q * (per_tensor_scale * s): two roundings instead of our one of
#   q * s / S_enc, so its `dequantize()` may differ from ours in the last float32 bit; it is
#   compared within 2 ulp, the codes and scales exactly;
# - it clamps block scales to at least 2^-6 (E4M3's smallest normal), where TE and we keep
#   E4M3 subnormals and 0: blocks with vmax < amax * 2^-6 / 448 would differ, and the data here
#   (row scales within e^+-4) has none.
def _te_codes_and_scales(blocks: torch.Tensor, s_enc: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """E2M1 codes and E4M3 scales of float32 [..., n, 16] blocks, in TE's operation order."""
    vmax = blocks.abs().amax(dim=-1, keepdim=True)
    scales = torch.clamp(vmax * (s_enc * (1 / 6)), max=448.0).to(torch.float8_e4m3fn).float()
    codes = round_to_e2m1(torch.clamp(blocks * (1.0 / (scales * (1.0 / s_enc))), -6.0, 6.0))
    return codes, scales


@pytest.mark.parametrize(
    ("shape", "scale", "dtype"),
    [
        ((64, 256), 1.0, torch.float32),
        ((128, 512), 1e-3, torch.float32),
        ((32, 1024), 50.0, torch.float32),
        ((4, 32, 64), 3.0, torch.float32),
        ((64, 128), 7.0, torch.bfloat16),
        ((32, 256), 0.02, torch.bfloat16),
    ],
)
def test_fake_quantize_1d_matches_torchao(
    shape: tuple[int, ...], scale: float, dtype: torch.dtype
) -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    g = torch.Generator().manual_seed(sum(shape))
    rows = torch.exp(torch.randn(*shape[:-1], 1, generator=g).clamp(-4, 4))
    x = (torch.randn(shape, generator=g) * rows * scale).to(dtype)
    blocks = x.float().view(*shape[:-1], -1, 16)
    amax = blocks.abs().amax()
    s_enc = global_scale(amax)
    codes, scales = _te_codes_and_scales(blocks, s_enc)
    ours = fake_quantize_1d(x)
    assert torch.equal(ours, (codes * scales / s_enc).view(shape).to(dtype))

    ao = NVFP4Tensor.to_nvfp4(x, block_size=16, per_tensor_scale=per_tensor_amax_to_scale(amax))
    ao_codes = f4_unpacked_to_f32(unpack_uint4(ao.qdata.view(torch.uint8))).view(blocks.shape)
    ao_scales = ao.scale.float().view(scales.shape)

    # Float64 products of these values are exact, so ties are checked without division.
    scale_tie = (blocks.abs().amax(-1, keepdim=True).double() * 2 * E4M3_MAX) == (
        (scales + ao_scales).double() * amax.double()
    )
    code_tie = (blocks.double() * 2 * E4M3_MAX * FP4_MAX) == (
        (codes + ao_codes).double() * amax.double() * scales.double()
    )
    scale_differs = scales != ao_scales
    code_differs = (codes != ao_codes) & ~scale_differs
    assert scale_tie[scale_differs].all()
    assert code_tie[code_differs].all()
    assert scale_differs.double().mean() < 0.02 and code_differs.double().mean() < 0.005
    if dtype == torch.float32:
        assert not scale_differs.any() and not code_differs.any()
        torch.testing.assert_close(ao.dequantize(torch.float32), ours, rtol=2.4e-7, atol=0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_exactly(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    rows = torch.exp(torch.randn(256, 1, generator=g))
    x = (torch.randn(256, 1024, generator=g) * rows).to(dtype)
    assert torch.equal(fake_quantize_1d(x.cuda()).cpu(), fake_quantize_1d(x))
    assert torch.equal(fake_quantize_2d(x.cuda()).cpu(), fake_quantize_2d(x))


def test_torchao_is_in_the_dev_extra_so_ci_runs_the_agreement_tests() -> None:
    """The tests here and in test_backends.py importorskip torchao; CI installs `.[dev]`, so they run there."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    dev = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"]["dev"]}
    assert "torchao" in dev and "0.18.0" in dev["torchao"].specifier
