"""1-bit Adam's compression stage in the core's fused passes (paper 003 Alg. 1 line 6, ``local_momentum``, and
lines 12-13, ``OneBitAdam.compressed``) against the backend path they replace on float32 CPU buckets, in one process
on a hand-made bucket with odd layer sizes and an empty layer, over the warm-up (backend ops either way) and the
compression steps that follow: bit for bit on the NumPy backend (the TF/Keras face's) and on the torch backend (these
passes have no sqrt: the frozen denominator is the backend's in both paths), Adam and AdamW, with and without weight
decay and the variance floor (whose cap raises some floored denominators to |mh|); the portable kernels give the AVX2
kernels' bits. The compressed allreduce of lines
7-11 is stood in for by a sign-times-mean-magnitude of the local momentum (the multi-rank tests cover the real one)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from fused_checks import assert_identical, counted
from fused_checks import backend as backend_and_buffers

from hvd_compress import _core
from hvd_compress.algorithms import onebit_adam
from hvd_compress.algorithms.onebit import OneBitBucket
from hvd_compress.ops import onebit_adam_kernels
from hvd_compress.torch.backend import TorchBackend

SIZES = [1000, 3, 0, 4097, 31]
FREEZE = 3
STEPS = range(1, FREEZE + 4)  # three warm-up steps, then three compression steps


def _bucket(wrap, dtype=np.float32) -> tuple[OneBitBucket, object]:
    rng = np.random.default_rng(3)
    n, cuts = sum(SIZES), np.cumsum([0, *SIZES])

    def views(flat):
        return [flat[lo:hi] for lo, hi in itertools.pairwise(cuts)]

    def buf(a):
        return wrap(np.ascontiguousarray(a, dtype=dtype))

    flat = buf(rng.standard_normal(n))
    seg = OneBitBucket(group=0, params=views(flat), sizes=list(SIZES), grad=buf(np.zeros(n)), exp_avg=buf(np.zeros(n)),
                  exp_avg_sq=buf(np.zeros(n)), fresh=None, work=wrap(np.zeros(n, np.float32)),
                  scratch=wrap(np.zeros(n, np.float32)), onebit=None, views=views)
    return seg, flat


def _run(backend, wrap, fused: bool, wd: float, decoupled: bool, floor: float, monkeypatch,
         dtype=np.float32) -> np.ndarray:
    """x | m | v after the steps, with the fused passes or (``fused=False``) the backend's ops (``work`` is scratch
    after the compression stage: the backend path leaves the capped denominators there)."""
    seg, x = _bucket(wrap, dtype)
    alg = onebit_adam.OneBitAdam(onebit_adam.OneBitOptions(freeze_step=FREEZE, variance_floor=floor), backend, [seg],
                                 None)
    group = {"betas": (0.9, 0.999), "eps": 1e-8, "lr": 1e-2, "weight_decay": wd, "decoupled_weight_decay": decoupled}
    ran = {"local_momentum_": 0, "apply_": 0}
    with monkeypatch.context() as patch:
        for name in ran:
            patch.setattr(onebit_adam_kernels, name, counted(ran, name, getattr(onebit_adam_kernels, name)))
        if not fused:
            patch.setattr(onebit_adam_kernels, "accepts", lambda *tensors: False)
        rng = np.random.default_rng(4)
        for t in STEPS:
            seg.grad[:] = wrap(rng.standard_normal(seg.numel).astype(dtype) * 1e-2)
            if t <= FREEZE:
                alg.warmup(seg, group, t)
                continue
            alg.local_momentum(seg, group)
            w = np.asarray(seg.work)  # the compressed average's stand-in: sign * mean |m_r|, the same in both runs
            seg.work[:] = wrap(np.where(w >= 0, 1, -1).astype(np.float32) * np.abs(w).mean(dtype=np.float32))
            alg.compressed(seg, group, t)
            if floor > 0:  # the variance floor's cap must have raised some denominators, or it goes untested
                d, m = np.asarray(seg.scratch), np.abs(np.asarray(seg.exp_avg, dtype=np.float32))
                lifted = np.concatenate([v <= f for v, f in zip(seg.views(d), seg.floor_denoms, strict=True)])
                raised = lifted & (m * np.float32(alg.cap(group, t)) > d)
                assert 0 < raised.sum() < lifted.size, f"step {t}: the cap raised {raised.sum()} denominators"
    compressed_steps = len(STEPS) - FREEZE
    want = compressed_steps if fused and dtype == np.float32 else 0  # the comparison is void unless they ran
    assert ran == {"local_momentum_": want, "apply_": want}, f"fused passes ran {ran}, expected {want} each"
    return np.concatenate([np.asarray(a, dtype=np.float32) for a in (x, seg.exp_avg, seg.exp_avg_sq)])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("floor", [0.0, 0.01])
@pytest.mark.parametrize(("wd", "decoupled"), [(0.0, False), (0.05, False), (0.05, True)])
def test_fused_onebit_adam_steps_are_bit_identical_to_the_backend_path(backend, wd, decoupled, floor,
                                                                       monkeypatch) -> None:
    """Adam (L2 in line 6's gradient) and AdamW (decoupled decay in line 13), over warm-up and compression steps."""
    xp, wrap = backend_and_buffers(backend)
    fused = _run(xp, wrap, True, wd, decoupled, floor, monkeypatch)
    plain = _run(xp, wrap, False, wd, decoupled, floor, monkeypatch)
    assert_identical(fused, plain, f"x | m | v, {backend} backend wd={wd} decoupled={decoupled} floor={floor}")


@pytest.mark.parametrize("decoupled", [False, True])
def test_portable_kernels_give_the_avx2_steps_bits(decoupled, monkeypatch) -> None:
    """HVDC_ONEBIT_KERNELS=scalar (the runtime's choice) and the AVX2 kernels: the same steps, bit for bit."""
    numpy_backend = pytest.importorskip("hvd_compress.tensorflow.backend").NumpyBackend
    avx2 = _run(numpy_backend, np.asarray, True, 0.05, decoupled, 0.01, monkeypatch)
    monkeypatch.setattr(onebit_adam_kernels, "scalar_kernels", lambda: True)
    scalar = _run(numpy_backend, np.asarray, True, 0.05, decoupled, 0.01, monkeypatch)
    assert_identical(scalar, avx2, f"x | m | v, portable vs AVX2 kernels, decoupled={decoupled}")


def test_kernels_portable_and_avx2_agree_on_an_infinite_parameter() -> None:
    rng = np.random.default_rng(5)
    n = sum(SIZES)
    g, m0 = (rng.standard_normal(n).astype(np.float32) * 1e-2 for _ in range(2))
    denom = np.abs(rng.standard_normal(n)).astype(np.float32) * 1e-2 + 1e-3
    x0 = rng.standard_normal(n).astype(np.float32)
    x0[[5, 1200]] = np.inf, -np.inf
    cuts = np.cumsum([0, *SIZES])
    out = []
    for scalar in (False, True):
        work, m, x = np.empty(n, np.float32), m0.copy(), x0.copy()
        params = [x[lo:hi] if hi > lo else None for lo, hi in itertools.pairwise(cuts)]
        _core.onebit_local_momentum(g, m, work, params, 0.1, 0.005, 0.9, scalar)
        floors = [0.0125] * len(SIZES)  # about a fifth of the denominators sit under it
        _core.onebit_adam_apply(work, m, denom, params, 0.9995, -0.01, floors, 1.5, scalar=scalar)
        out.append(np.concatenate([work, m, x]).tobytes())
    assert out[0] == out[1], "HVDC_ONEBIT_KERNELS=scalar and the AVX2 kernels differ"


def test_half_bucket_takes_the_backend_path(monkeypatch) -> None:
    """float16 state: the fused passes refuse it (``accepts``), the backend's ops run and the steps are finite."""
    state = _run(TorchBackend, torch.from_numpy, True, 0.05, False, 0.01, monkeypatch, dtype=np.float16)
    assert np.isfinite(state).all()


def test_bad_buffers_are_refused_with_the_argument_named() -> None:
    work, m = np.zeros(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="onebit_local_momentum: m has 8 elements, expected 7"):
        _core.onebit_local_momentum(np.zeros(7, np.float32), m, work, None, 0.1, 0.0, 0.9)
    with pytest.raises(ValueError, match=r"onebit_adam_apply: layer sizes sum to 5 for 8"):
        _core.onebit_adam_apply(work, m, np.ones(8, np.float32), [np.zeros(5, np.float32)], 1.0, -0.01)
    with pytest.raises(ValueError, match="must be float32"):
        _core.onebit_adam_apply(work, m, np.ones(8), [np.zeros(8, np.float32)], 1.0, -0.01)
