"""hc.DistributedOptimizer(op=hc.SLAMB) on real MPI processes against the NumPy simulation of the spec
(hvd_compress.reference.slamb; shared/specs/slamb.md), element by element, at n = 2, 3, 4."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, Cases
from workers.common import rank_input

from hvd_compress.reference import slamb as ref

SHAPES = [(12, 25), (25,), (8, 30), (5, 6), (7,)]
NUMEL = sum(math.prod(s) for s in SHAPES)
LAMB = {"lr": 0.01, "weight_decay": 0.01, "eps": 1e-6}
TRACE_STEPS = 11
# (n, k, H, mask, fused, quiet): ``quiet`` names parameters without a gradient on every rank but 0 (a branch only
# rank 0's batches take): the 1-D (25,) and the masked (8, 30), whose local v stays 0 on the other ranks while their
# averaged m does not (no step on it there: algorithms.slamb.denominator_floor).
QUIET = "1,2"
TRACES = [(2, 0.25, 3, "cyclic", True, ""), (3, 0.1, 4, "bernoulli", False, ""), (3, 0.1, 4, "bernoulli", True, ""),
          (4, 0.1, 5, "cyclic", True, ""), (2, 0.25, 3, "cyclic", True, QUIET), (3, 0.1, 4, "bernoulli", False, QUIET),
          (4, 0.1, 5, "cyclic", True, QUIET)]


def _trace_case(ratio: float, interval: int, kind: str, fused: bool,
                quiet: str) -> tuple[tuple[str, ...], dict[str, str]]:
    return (("trace", str(ratio), str(interval), kind, str(TRACE_STEPS), *((quiet,) if quiet else ())),
            {"SLAMB_WORKER_BACKEND_OPS": "0" if fused else "1"})


# Every case at one rank count in one launch. The backend-ops traces run last at their count: the worker switches the
# fused passes off for the rest of its process.
CASES = {2: [_trace_case(*TRACES[0][1:]), _trace_case(*TRACES[4][1:]), ("identity", "8"), ("reshaped",)],
         3: [_trace_case(*TRACES[2][1:]), ("identity", "8"), ("resume", "9", "5"), ("bad",), ("reshaped",),
             _trace_case(*TRACES[1][1:]), _trace_case(*TRACES[5][1:])],
         4: [_trace_case(*TRACES[3][1:]), _trace_case(*TRACES[6][1:])]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("slamb_optimizer.py", CASES, tmp_path_factory.mktemp("slamb_optimizer"), timeout_per_case=60)


def _x0() -> np.ndarray:
    g = torch.Generator().manual_seed(7)
    return torch.cat([(torch.randn(s, generator=g) * 0.5).reshape(-1) for s in SHAPES]).double().numpy()


# fused: the core's fused float32 passes (what both faces run); False: the backend's tensor ops.
@pytest.mark.parametrize(("n", "ratio", "interval", "kind", "fused", "quiet"), TRACES)
def test_slamb_matches_reference_every_step_on_every_rank(n: int, ratio: float, interval: int, kind: str,
                                                          fused: bool, quiet: str, launched) -> None:
    steps = TRACE_STEPS
    ranks = launched.ranks(n, _trace_case(ratio, interval, kind, fused, quiet))
    grads = [[rank_input(r, NUMEL, torch.float32, seed=t + 1).double().numpy() for r in range(n)]
             for t in range(steps)]
    offsets = np.cumsum([0] + [math.prod(s) for s in SHAPES])
    for i in (int(q) for q in quiet.split(",") if q):  # no gradient there on the ranks but 0: zeros
        for step in grads:
            for g in step[1:]:
                g[offsets[i]:offsets[i + 1]] = 0.0
    want = ref.slamb(_x0(), grads, SHAPES, compress_ratio=ratio, sync_interval=interval, mask=kind, seed=99,
                     grad_size_thr=100, **LAMB)
    always = ref.always_ranges(SHAPES, 100)
    for t in range(steps):
        what = f"n={n} k={ratio} H={interval} {kind} step {t + 1}"
        mask = want["masks"][t]
        for r, rk in enumerate(ranks):
            assert np.array_equal(rk["masks"][t].numpy(), mask), f"{what}: rank {r} mask differs"
            assert np.allclose(rk["freshness"][t].numpy(), want["freshness"][t], rtol=1e-6, atol=0), what
            got_m = rk["momentum"][t].double().numpy()
            err_m = np.max(np.abs(got_m - want["momentum"][t][r]))
            assert err_m <= 1e-6, f"{what}: rank {r} momentum off by {err_m}"
            got = rk["params"][t].double().numpy()
            err = np.max(np.abs(got - want["params"][t][r]))
            assert err <= 2e-5, f"{what}: rank {r} parameters off by {err}"
            # no runaway where a rank had no gradient (x0 ~ N(0, 0.5^2); the paper's rule went past 100 here)
            assert np.max(np.abs(got)) < 5, f"{what}: rank {r} |x| reached {np.max(np.abs(got)):.1f}"
        # m[M_t] identical on every rank after step 4; x identical after a sync step, different between.
        m0 = ranks[0]["momentum"][t].numpy()
        for r, rk in enumerate(ranks[1:], 1):
            assert np.array_equal(rk["momentum"][t].numpy()[mask], m0[mask]), f"{what}: rank {r} m[M] differs"
        same = all(torch.equal(rk["params"][t], ranks[0]["params"][t]) for rk in ranks)
        assert same == ((t + 1) % interval == 0), f"{what}: parameters identical on every rank: {same}"
    assert sum(always[1::2]) < NUMEL  # some elements are masked, not all forced
    final = [rk["final"] for rk in ranks]
    assert all(torch.equal(f, final[0]) for f in final), "synchronize_parameters left ranks different"
    # Bytes: a sync step adds the dense parameter average to the masked momentum.
    per_step = ranks[0]["bytes"]
    assert per_step[interval - 1] > per_step[0] + 4 * NUMEL * (n - 1) // n, per_step


@pytest.mark.parametrize("n", [2, 3])
def test_slamb_k1_h1_sync_grad_equals_lamb_on_averaged_gradients(n: int, launched) -> None:
    for r, rk in enumerate(launched.ranks(n, ("identity", "8"))):
        worst = max(rk["diffs"])
        # Equal up to the float32 rounding of the dense parameter average of identical parameters.
        assert worst <= 4e-7 * rk["scale"], f"rank {r} of {n}: SLAMB(k=1, H=1) differs from LAMB by {worst}"


def test_slamb_resumed_run_is_bit_identical(launched) -> None:
    for r, rk in enumerate(launched.ranks(3, ("resume", "9", "5"))):
        assert torch.equal(rk["straight"], rk["resumed"]), f"rank {r}: resumed run differs from the straight one"
        assert rk["step"] == 9


def test_slamb_bad_input_raises_on_every_rank_with_state_untouched(launched) -> None:
    ranks = launched.ranks(3, ("bad",))
    for r, rk in enumerate(ranks):
        for key in ("compress_ratio=0.0", "compress_ratio=1.5", "sync_interval=0", "mask=x"):
            assert rk[key].startswith("ValueError"), f"rank {r} {key}: {rk[key]}"
        assert rk["nan"].startswith(USAGE) and "non-finite" in rk["nan"], f"rank {r}: {rk['nan']}"
        assert rk["seed"].startswith("MismatchError") and "seed=" in rk["seed"], f"rank {r}: {rk['seed']}"
        assert rk["other_algorithm"].startswith("ValueError") and "OneBitLamb" in rk["other_algorithm"]
        assert rk["other_world"].startswith("ValueError") and "world_size" in rk["other_world"]
        assert rk["nan_unchanged"] and rk["load_unchanged"], f"rank {r}: state changed by a rejected call"
        assert rk["nan_again"].startswith(USAGE) and rk["retry"] == "no error", f"rank {r}: {rk['retry']}"
    # The retried step is step 4 of sync_interval 4: a parameter average, so the same parameters on every rank.
    assert all(torch.equal(rk["after_retry"], ranks[0]["after_retry"]) for rk in ranks)
    assert not torch.equal(ranks[0]["after_retry"], ranks[0]["after"])


@pytest.mark.parametrize("n", [2, 3])
def test_slamb_checkpoint_of_a_same_count_reshaped_parameter_is_refused_with_nothing_changed(n: int, launched) -> None:
    """A (5, 6) parameter saved, loaded where it is (6, 5): the element counts agree, the shapes do not. ValueError
    on every rank before anything loads (the wrapped LAMB's state included); a checkpoint without the recorded
    shapes (the schema before them) still loads, checked by counts."""
    for r, rk in enumerate(launched.ranks(n, ("reshaped",))):
        assert rk["error"].startswith("ValueError: SLAMB.load_state_dict"), f"n={n} rank {r}: {rk['error']}"
        assert "shape" in rk["error"] and "(6, 5)" in rk["error"], f"n={n} rank {r}: {rk['error']}"
        assert rk["changed"] == [], (
            f"n={n} rank {r}: tensors {rk['changed']} of {rk['tensors']} (parameters, then m, step, v per parameter, "
            "the freshness and the step) changed by the refused checkpoint")
        assert rk["old"] == "no error" and rk["old_equal"], f"n={n} rank {r}: shape-less checkpoint: {rk['old']}"
