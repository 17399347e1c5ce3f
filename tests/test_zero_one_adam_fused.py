"""0/1 Adam's local step (spec L1-L3) and a sync step's L5-L6 in 1-bit Adam's fused passes of the core against the
backend's ops they replace on float32 CPU buckets: one process, a hand-made bucket with odd layer sizes and an empty
layer, v frozen with some elements under the variance floor (so that the cap raises their denominators), several
local steps and a sync, with and without decoupled weight decay and v's bias correction: x, m, u and x_anchor bit for
bit on the NumPy backend (the TF/Keras face's) and on the torch backend. The multi-rank tests
(``test_zero_one_adam.py``) run the fused steps against the NumPy reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fused_checks import assert_identical, counted
from fused_checks import backend as backend_and_buffers

from hvd_compress.algorithms import zero_one_adam
from hvd_compress.ops import onebit_adam_kernels

SIZES = [1000, 3, 0, 4097, 31]
STEPS = 4


def _run(backend, wrap, fused: bool, wd: float, correction: bool, monkeypatch,
         dtype=np.float32) -> np.ndarray:
    """x | m | u | x_anchor after ``STEPS`` local steps and a sync step (``work`` holding a made-up ubar), with the
    fused passes or (``fused=False``) the backend's ops."""
    rng = np.random.default_rng(3)
    n, cuts = sum(SIZES), np.cumsum([0, *SIZES])

    def views(flat):
        return [flat[lo:hi] for lo, hi in itertools.pairwise(cuts)]

    def buf(a, dt=dtype):
        return wrap(np.ascontiguousarray(a, dtype=dt))

    v = rng.random(n) * 1e-4
    v[rng.random(n) < 0.2] = 1e-12  # units dead through the variance steps: the floor lifts them
    x = buf(rng.standard_normal(n))
    seg = zero_one_adam.ZeroOneBucket(
        group=0, params=views(x), sizes=list(SIZES), grad=buf(np.zeros(n)), exp_avg=buf(rng.standard_normal(n) * 1e-3),
        exp_avg_sq=buf(v), u=buf(np.zeros(n)), anchor=buf(rng.standard_normal(n)), work=buf(np.zeros(n), np.float32),
        scratch=buf(np.zeros(n), np.float32), denom=buf(np.zeros(n), np.float32), onebit=None, views=views)
    options = zero_one_adam.ZeroOneAdamOptions(var_freeze_step=0, variance_bias_correction=correction)
    alg = zero_one_adam.ZeroOneAdam(options, backend, [seg], None)
    alg.var_updates = 7
    group = {"betas": (0.9, 0.999), "eps": 1e-8, "lr": 1e-2, "weight_decay": wd}
    ran = {"local_momentum_": 0, "apply_": 0}
    with monkeypatch.context() as patch:
        for name in ran:
            patch.setattr(onebit_adam_kernels, name, counted(ran, name, getattr(onebit_adam_kernels, name)))
        if not fused:
            patch.setattr(onebit_adam_kernels, "accepts", lambda *tensors: False)
        for _ in range(STEPS):
            seg.grad[:] = wrap(rng.standard_normal(n).astype(dtype) * 1e-2)
            alg._phase2(seg, group, zero_one_adam.LOCAL)
        lifted = np.concatenate([np.asarray(d) <= f for d, f in zip(views(seg.denom), seg.floor_denoms, strict=True)])
        assert 0 < lifted.sum() < n, "the variance floor lifted no element (or every one): the cap goes untested"
        local = np.concatenate([np.asarray(a, dtype=np.float32) for a in (x, seg.exp_avg, seg.u)])
        seg.work[:] = wrap(np.asarray(seg.u, dtype=dtype) + rng.standard_normal(n).astype(dtype) * 1e-4)
        alg._phase2(seg, group, zero_one_adam.SYNC)
    want = STEPS if fused and dtype == np.float32 else 0  # the comparison is void unless they ran
    assert ran == {"local_momentum_": want, "apply_": want + (want > 0)}, f"fused passes ran {ran}"
    return np.concatenate([local, *(np.asarray(a, dtype=np.float32) for a in (x, seg.exp_avg, seg.u, seg.anchor))])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("correction", [False, True])
def test_fused_local_and_sync_steps_are_bit_identical_to_the_backend_path(backend, wd, correction, monkeypatch) -> None:
    xp, wrap = backend_and_buffers(backend)
    got = _run(xp, wrap, True, wd, correction, monkeypatch)
    assert_identical(got, _run(xp, wrap, False, wd, correction, monkeypatch),
                     f"x | m | u after the local steps, then after the sync, {backend} backend wd={wd} "
                     f"variance_bias_correction={correction}")
    assert np.isfinite(got).all()
