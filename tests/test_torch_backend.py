"""The torch Backend keeps scalars in float32 on half tensors (PyTorch's add_(alpha=) rounds them to half), and its
NaN/Inf checks, which read only the extremes, find every NaN and Inf."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hvd_compress.reference.dtypes import round_to
from hvd_compress.torch.backend import TorchBackend as B


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scalar_ops_on_half_tensors_round_once_with_a_float32_scalar(dtype):
    name = str(dtype).removeprefix("torch.")
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(100_000, generator=gen).to(dtype), torch.randn(100_000, generator=gen).to(dtype)
    ad, bd = a.double().numpy(), b.double().numpy()

    def off(got: torch.Tensor, want: np.ndarray) -> float:
        """Fraction of elements not equal to ``want`` rounded once to the half dtype."""
        return float(np.mean(got.double().numpy() != round_to(want, name)))

    # One rounding of the float32-opmath result: a few in 1e5 elements differ from the exact float64 rounding
    # (the float32 result rounded again); a scalar rounded to half first shifts about 1% of them.
    limit = 1e-3
    assert off(B.add_(a.clone(), b, alpha=0.1), ad + 0.1 * bd) < limit
    assert off(B.add_(a.clone(), 1e-3), ad + 1e-3) < limit
    xs = [a.clone()]
    B.foreach_add_(xs, [b], alpha=0.1)
    assert off(xs[0], ad + 0.1 * bd) < limit
    xs = [a.clone()]
    B.foreach_mul_(xs, 0.9)
    assert off(xs[0], ad * 0.9) < limit
    out = torch.empty_like(a)
    assert off(B.sub(a, b, 0.3, out), ad - 0.3 * bd) < limit
    # torch's own kernels round the scalar to the half dtype: the case this backend exists to avoid.
    assert off(a.clone().add_(b, alpha=0.1), ad + 0.1 * bd) > 3 * limit


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nonfinite_checks_find_every_nan_and_inf_wherever_it_is(dtype):
    """``any_nonfinite`` reads only the extremes (aminmax): a NaN, +Inf or -Inf anywhere, alone or beside another,
    must still be found, and ``first_nonfinite`` must name the first."""
    x = torch.linspace(-3, 3, 10_007).to(dtype)
    assert not B.any_nonfinite(x) and B.first_nonfinite(x) is None
    assert not B.any_nonfinite(x[:0]) and B.first_nonfinite(x[:0]) is None
    for bad in (float("nan"), float("inf"), -float("inf")):
        for at in (0, 1, 5_000, 10_006):
            y = x.clone()
            y[at] = bad
            assert B.any_nonfinite(y), (dtype, bad, at)
            where, value = B.first_nonfinite(y)
            assert where == at and (value == bad or (math.isnan(value) and math.isnan(bad))), (dtype, bad, at, value)
    y = x.clone()
    y[3], y[9] = float("inf"), float("nan")  # an Inf before a NaN: the first is the Inf
    assert B.any_nonfinite(y) and B.first_nonfinite(y)[0] == 3
    y = x.clone()
    y[2], y[4] = float("inf"), -float("inf")
    assert B.any_nonfinite(y) and B.first_nonfinite(y)[0] == 2
