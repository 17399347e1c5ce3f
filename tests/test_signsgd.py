"""EF-signSGD with majority vote (``op=hc.SignSGD``, docs/algorithms/signsgd.md): the NumPy reference against
the papers' rule, Birder's sign collective with the tie uniforms as the majority vote, and the torch optimizer on
real MPI processes (2, 3, 4 ranks) replayed through the reference element by element."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, load_pickled_ranks, load_ranks, mpirun

from hvd_compress.algorithms.signsgd import TIE_UNIFORM
from hvd_compress.reference import birder as birder_ref
from hvd_compress.reference import signsgd as ref

F32 = np.float32


def test_reference_single_rank_is_karimireddy_ef_signsgd() -> None:
    """One rank: the vote is its own sign, so the step is Karimireddy Alg. 1: delta = ||p||_1/d sign(p)."""
    rng = np.random.default_rng(0)
    x, e = rng.standard_normal(40).astype(F32), np.zeros(40, F32)
    for _ in range(3):
        g = rng.standard_normal(40).astype(F32)
        p = (g * F32(0.1) + e).astype(np.float64)
        delta = np.abs(p).mean() * np.where(p >= 0, 1.0, -1.0)
        (new_x,), ((new_e,),) = ref.step([x], [[g]], [[e]], 0.1)
        np.testing.assert_allclose(new_x, x - delta, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(new_e, p - delta, rtol=1e-6, atol=1e-7)
        x, e = new_x, new_e


def test_majority_vote_and_ties() -> None:
    signs = [np.array([1, 1, -1, -1], F32), np.array([1, -1, -1, 1], F32), np.array([-1, 1, -1, 1], F32)]
    np.testing.assert_array_equal(ref.majority_vote(signs), [1, 1, -1, 1])
    np.testing.assert_array_equal(ref.majority_vote(signs[:2]), [1, 1, -1, 1])  # 0 -> +1
    np.testing.assert_array_equal(ref.sign(np.array([0.0, -0.0, 1e-45, -1e-45], F32)), [1, 1, 1, -1])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 64])
def test_birder_sign_collective_with_tie_uniforms_is_the_vote(n: int) -> None:
    """What the optimizer relies on: Birder's flat sign allreduce, given +/-1 inputs, zero errors and uniforms of
    TIE_UNIFORM, returns sign(sum of signs) with a tie +1 (every tie pattern among n ranks occurs below)."""
    rng = np.random.default_rng(n)
    d = 50
    signs = np.where(rng.random((n, d)) < 0.5, F32(1), F32(-1))
    signs[:, 0] = np.where(np.arange(n) < n // 2, F32(1), F32(-1))  # a tie where n is even
    dpad = birder_ref.padded_numel(d, n)
    uniforms = (np.full((n, dpad), TIE_UNIFORM, F32), np.full(dpad, TIE_UNIFORM, F32))
    errors_w = [np.zeros(dpad, F32) for _ in range(n)]
    errors_s = [np.zeros(dpad // n, F32) for _ in range(n)]
    got = birder_ref.hierarchical_1bit_allreduce(signs, errors_w, errors_s, 1, uniforms)
    np.testing.assert_array_equal(got, ref.majority_vote(list(signs)))
    assert all(not e.any() for e in errors_w), "+/-1 inputs leave the worker error at zero"


def _replay(ranks: list[dict], n: int, key: str = "params", lrs: list[float] | None = None) -> list[list[np.ndarray]]:
    """The reference run from the same initial parameters and every rank's recorded gradients of the run ``key``, at
    the lrs ``lrs`` (0.05 every step if None)."""
    grads = "grads" if key == "params" else f"{key}_grads"
    lrs = [0.05] * len(ranks[0][grads]) if lrs is None else lrs
    x = [np.asarray(t) for t in ranks[0]["initial"]]
    e = [[np.zeros_like(a) for a in x] for _ in range(n)]
    out, error_lr = [], lrs[0]
    for t, lr in enumerate(lrs):
        x, e = ref.step(x, [[np.asarray(g) for g in ranks[r][grads][t]] for r in range(n)], e, lr, error_lr)
        out.append(x)
        error_lr = lr
    return out


def _assert_schedule_followed(ranks: list[dict], n: int, lrs: list[float], what: str) -> None:
    """The scheduled run (lr through 0, restored, dropped 10x): every rank alike, equal to the reference, and at lr 0
    not one element moved (the error carried from the lr before is dropped, not stepped on)."""
    assert 0.0 in lrs and lrs[-1] < max(lrs), "the schedule must pass through 0 and a drop"
    want = _replay(ranks, n, "scheduled", lrs)
    initial = [np.asarray(a) for a in ranks[0]["initial"]]
    for r in range(n):
        got = [[np.asarray(a) for a in step] for step in ranks[r]["scheduled"]]
        for t, lr in enumerate(lrs):
            for k, (a, b) in enumerate(zip(got[t], want[t], strict=True)):
                np.testing.assert_array_equal(a, np.asarray(ranks[0]["scheduled"][t][k]),
                                              err_msg=f"{what} rank {r} differs from rank 0 at step {t + 1}")
                np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7,
                                           err_msg=f"{what} rank {r} step {t + 1} (lr {lr}) param {k} vs the reference")
                if lr == 0:
                    before = got[t - 1][k] if t else initial[k]
                    moved = float(np.abs(a - before).max())
                    assert moved == 0, f"{what} rank {r}: lr 0 at step {t + 1} moved param {k} by {moved:.3g}"


@pytest.mark.parametrize(("n", "overlap", "bucket_mb"), [(2, "1", "25"), (3, "0", "0.0001"), (4, "1", "0.0001")],
                         ids=["n2-overlap", "n3-buckets", "n4-overlap-buckets"])
def test_signsgd_optimizer_on_every_rank(n: int, overlap: str, bucket_mb: str, out_dir) -> None:
    mpirun("signsgd_optimizer.py", n, out_dir, overlap, bucket_mb, timeout=240)
    ranks = load_ranks(out_dir, n)
    if bucket_mb != "25":
        assert ranks[0]["buckets"] > 1, "the small bucket_mb must cut the model into several buckets"
    want = _replay(ranks, n)
    for r in range(n):
        for t, (got, exp) in enumerate(zip(ranks[r]["params"], want, strict=True)):
            for k, (a, b) in enumerate(zip(got, exp, strict=True)):
                assert torch.equal(a, ranks[0]["params"][t][k]), f"rank {r} differs from rank 0 at step {t + 1}"
                np.testing.assert_allclose(a.numpy(), b, rtol=2e-6, atol=1e-7,
                                           err_msg=f"n={n} rank {r} step {t + 1} param {k} vs the reference")
        for run in ("resumed", "resumed_unrecorded"):  # the latter from a checkpoint without error_lr
            for t, (got, exp) in enumerate(zip(ranks[r][run], ranks[r]["params"][3:], strict=True)):
                for a, b in zip(got, exp, strict=True):
                    assert torch.equal(a, b), f"rank {r}: {run} run differs at step {t + 4}"
        assert "ValueError" in ranks[r]["bad_error_lr"] and "error_lr" in ranks[r]["bad_error_lr"]
        nan = ranks[r]["nan"]
        assert any(k in nan for k in USAGE) and "non-finite" in nan, f"rank {r}: {nan}"
        assert ranks[r]["nan_state_unchanged"] and ranks[r]["nan_params_unchanged"], f"rank {r}: changed on NaN"
        assert "TypeError" in ranks[r]["unknown_option"] and "seed" in ranks[r]["unknown_option"]
        assert "ValueError" in ranks[r]["momentum"] and "momentum" in ranks[r]["momentum"]
        assert "TypeError" in ranks[r]["not_sgd"] and "SGD" in ranks[r]["not_sgd"]
        assert "ValueError" in ranks[r]["other_algorithm"] and "Birder" in ranks[r]["other_algorithm"]
        assert "ValueError" in ranks[r]["other_world"] and "world_size" in ranks[r]["other_world"]
    _assert_schedule_followed(ranks, n, ranks[0]["schedule"], f"torch n={n}")


@pytest.mark.parametrize(("n", "legacy", "bucket_mb"), [(3, "0", "0.0001"), (2, "1", "25")],
                         ids=["keras3-n3-buckets", "tf_keras-n2"])
def test_signsgd_keras_on_every_rank(n: int, legacy: str, bucket_mb: str, out_dir) -> None:
    """Keras 3 and tf_keras: the same rule through ``tensorflow.algorithm_step`` (a custom loop), replayed through
    the reference; a tf.train.Checkpoint resume bit for bit; an lr schedule through 0 (``learning_rate`` set as
    LearningRateScheduler sets it) equal to the reference, nothing moving at lr 0; bad options raising on every
    rank."""
    mpirun("keras_signsgd.py", n, out_dir, bucket_mb, timeout=400, env={"TF_USE_LEGACY_KERAS": legacy})
    ranks = load_pickled_ranks(out_dir, n)
    x = ranks[0]["initial"]
    e = [[np.zeros_like(a) for a in x] for _ in range(n)]
    for t in range(len(ranks[0]["params"])):
        x, e = ref.step(x, [ranks[r]["grads"][t] for r in range(n)], e, 0.05)
        for r in range(n):
            for k, (a, b) in enumerate(zip(ranks[r]["params"][t], x, strict=True)):
                np.testing.assert_array_equal(a, ranks[0]["params"][t][k], err_msg=f"rank {r} step {t + 1}")
                np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7, err_msg=f"rank {r} step {t + 1} param {k}")
    for r in range(n):
        for t, (got, want) in enumerate(zip(ranks[r]["resumed"], ranks[r]["params"][2:], strict=True)):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"rank {r}: resumed run differs at step {t + 3}")
        assert "TypeError" in ranks[r]["unknown_option"] and "seed" in ranks[r]["unknown_option"]
        assert "TypeError" in ranks[r]["lamb_option"] and "min_coeff" in ranks[r]["lamb_option"]
        assert "ValueError" in ranks[r]["momentum"] and "momentum" in ranks[r]["momentum"]
        assert "TypeError" in ranks[r]["not_sgd"] and "SGD" in ranks[r]["not_sgd"]
    _assert_schedule_followed(ranks, n, ranks[0]["schedule"], f"{'tf_keras' if legacy == '1' else 'keras3'} n={n}")
