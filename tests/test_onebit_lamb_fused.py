"""1-bit LAMB's compression stage (paper 001 Alg. 1 lines 14-21) in the core's fused passes against the backend
path it replaces on float32 CPU buckets (``OneBitLamb.compressed``), in one process on a hand-made bucket with
odd layer sizes and an empty layer: bit for bit on the NumPy backend (the TF/Keras face's), and on the torch
backend once its sqrt is the correctly rounded one (torch's float32 CPU sqrt is one ulp off on some elements,
the only operation the fused passes do not share with it; the multi-rank reference tests cover the rest)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hvd_compress import _core
from hvd_compress.algorithms import onebit_lamb
from hvd_compress.algorithms.onebit import OneBitBucket
from hvd_compress.torch.backend import TorchBackend

SIZES = [1000, 3, 0, 4097, 31]
STEPS = (6, 7, 8)  # compression-stage steps after freeze_step=5


def _bucket(wrap, seed: int, dtype=np.float32) -> tuple[OneBitBucket, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, cuts = sum(SIZES), np.cumsum([0, *SIZES])
    x = rng.standard_normal(n).astype(dtype)
    v = (rng.standard_normal(n) ** 2 * 1e-4).astype(dtype)
    v[::17] = 0  # elements the variance floor lifts

    def views(flat):
        return [flat[lo:hi] for lo, hi in itertools.pairwise(cuts)]

    def buf(a):
        return wrap(np.ascontiguousarray(a, dtype=dtype))

    flat = buf(x)
    seg = OneBitBucket(group=0, params=views(flat), sizes=list(SIZES), grad=buf(np.zeros(n)),
                  exp_avg=buf(rng.standard_normal(n) * 1e-2), exp_avg_sq=buf(v), fresh=buf(v * 1.1),
                  work=wrap(np.zeros(n, np.float32)), scratch=wrap(np.zeros(n, np.float32)), onebit=None, views=views,
                  lamb_coeff_freeze=[0.7] * len(SIZES), last_factor=[1.0] * len(SIZES))
    return seg, flat


def _run(backend, wrap, fused: bool, wd: float, bias: bool, floor: float, monkeypatch,
         dtype=np.float32) -> tuple[np.ndarray, list[float]]:
    seg, x = _bucket(wrap, 3, dtype)
    alg = onebit_lamb.OneBitLamb(onebit_lamb.OneBitLambOptions(freeze_step=5, variance_floor=floor), backend, [seg],
                                 None)
    accepts = onebit_lamb.fused_ops.accepts
    if fused and dtype == np.float32:  # the comparison is void unless the fused passes do run
        assert accepts(seg.work, seg.exp_avg, seg.fresh, *(p for p in seg.params if p.shape[0]))
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(onebit_lamb.fused_ops, "accepts", lambda *tensors: False)
        group = {"betas": (0.9, 0.999), "eps": 1e-6, "lr": 1e-2, "weight_decay": wd, "bias_correction": bias}
        rng = np.random.default_rng(4)
        for t in STEPS:
            seg.work[:] = wrap(rng.standard_normal(seg.numel).astype(np.float32) * 1e-2)
            alg.compressed(seg, group, t)
    state = [np.asarray(a, dtype=np.float32) for a in (x, seg.exp_avg, seg.fresh)]
    assert accepts is onebit_lamb.fused_ops.accepts
    return np.concatenate(state), list(seg.last_factor)


def _assert_identical(got: tuple, want: tuple, what: str) -> None:
    (a, fa), (b, fb) = got, want
    diff = np.flatnonzero(a.view(np.int32) != b.view(np.int32))
    assert diff.size == 0, (f"{what}: {diff.size} of {a.size} values (x | m | fresh) differ, first {diff[0]}: "
                            f"fused {a[diff[0]]!r}, backend {b[diff[0]]!r}")
    assert fa == fb, f"{what}: clipped factors {fa} != backend's {fb}"


CASES = [(wd, bias, floor) for wd in (0.0, 0.05) for bias in (True, False) for floor in (0.0, 0.01)]


@pytest.mark.parametrize(("wd", "bias", "floor"), CASES)
def test_fused_compressed_step_is_bit_identical_to_numpy_backend(wd, bias, floor, monkeypatch) -> None:
    numpy_backend = pytest.importorskip("hvd_compress.tensorflow.backend").NumpyBackend
    fused = _run(numpy_backend, np.asarray, True, wd, bias, floor, monkeypatch)
    plain = _run(numpy_backend, np.asarray, False, wd, bias, floor, monkeypatch)
    _assert_identical(fused, plain, f"NumPy backend wd={wd} bias={bias} floor={floor}")


@pytest.mark.parametrize(("wd", "bias", "floor"), CASES)
def test_fused_compressed_step_is_bit_identical_to_torch_backend_up_to_its_sqrt(wd, bias, floor, monkeypatch) -> None:
    monkeypatch.setattr(TorchBackend, "sqrt", staticmethod(lambda x, out: out.copy_(torch.sqrt(x.double()))))
    fused = _run(TorchBackend, torch.from_numpy, True, wd, bias, floor, monkeypatch)
    plain = _run(TorchBackend, torch.from_numpy, False, wd, bias, floor, monkeypatch)
    _assert_identical(fused, plain, f"torch backend wd={wd} bias={bias} floor={floor}")


def test_half_bucket_takes_the_backend_path(monkeypatch) -> None:
    """float16 state: the fused passes refuse it (``accepts``), the backend's ops run and the step is finite."""
    seg, _ = _bucket(torch.from_numpy, 3, np.float16)
    assert not onebit_lamb.fused_ops.accepts(seg.work, seg.exp_avg, seg.fresh, *seg.params)
    state, _ = _run(TorchBackend, torch.from_numpy, True, 0.05, True, 0.01, monkeypatch, dtype=np.float16)
    assert np.isfinite(state).all()


def test_portable_and_avx2_kernels_give_the_same_bits() -> None:
    rng = np.random.default_rng(5)
    n = sum(SIZES)
    inputs = [rng.standard_normal(n).astype(np.float32) * 1e-2 for _ in range(2)]
    fresh0 = (rng.standard_normal(n) ** 2).astype(np.float32) * 1e-4
    denom = np.abs(rng.standard_normal(n)).astype(np.float32) * 1e-2 + 1e-3
    x0 = rng.standard_normal(n).astype(np.float32)
    out = []
    for scalar in (False, True):
        work, m, fresh, x = inputs[0].copy(), inputs[1].copy(), fresh0.copy(), x0.copy()
        maxes = _core.onebit_lamb_moments(work, m, fresh, denom, SIZES, [0.001] * len(SIZES), -0.9, 0.1, 0.999, 0.001,
                                          0.03, 1e-6, scalar)
        cuts = np.cumsum([0, *SIZES])
        params = [x[lo:hi] if hi > lo else None for lo, hi in itertools.pairwise(cuts)]
        _core.onebit_lamb_apply(m, denom, params, 0.27, 0.05, [-0.01] * len(SIZES), scalar)
        out.append((np.concatenate([m, fresh, x]).tobytes(), maxes))
    assert out[0] == out[1], "HVDC_ONEBIT_KERNELS=scalar and the AVX2 kernels differ"
