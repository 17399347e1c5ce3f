"""hck.DistributedOptimizer(op=hck.PowerSGD) in Keras 3 and tf_keras on real MPI processes (2, 3 and 4 ranks) against
hvd_compress.reference.powersgd (float64, n virtual ranks) on the same gradients: the reduced gradients, every rank's
error, P and Q over steps crossing start_powerSGD_iter with warm start; a resume from the optimizer's variables bit
for bit; bad options raising on every rank. One process: the Keras faces' matrix work with a zero matrix and an inf
against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_pickled_ranks, mpirun

from hvd_compress.reference.powersgd import PowerSGD

pytest.importorskip("tensorflow")

START, STEPS, RESUME_AT = 2, 5, 3  # as tests/workers/powersgd_keras.py


def numpy_draw(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    """The Keras faces' first Q: NumPy's default_rng(seed), one float32 standard normal per Q in order."""
    gen = np.random.default_rng(seed)
    return [gen.standard_normal(s, dtype=np.float32).astype(np.float64) for s in shapes]


# The reduced gradient is read back as (variable before) - (variable after) through SGD(learning_rate=1): one more
# float32 rounding of the variable's magnitude. With the float32 products and orthogonalizations carried by the error
# feedback over 3 compressed steps, 2e-5 of the largest magnitude bounds it (measured: below 4e-7).
# Rank 1 at 4 ranks is the long tier's; the fast tier's twin runs it at 2 (no 4-rank TensorFlow pool in make test).
@pytest.mark.parametrize(("flavour", "rank_r", "n"), [("keras", 2, 2), ("tf_keras", 3, 3), ("keras", 1, 2),
                                                      pytest.param("keras", 1, 4, marks=pytest.mark.long)])
def test_keras_powersgd_matches_numpy_reference(flavour: str, rank_r: int, n: int, out_dir) -> None:
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else None
    mpirun("powersgd_keras.py", n, out_dir, str(rank_r), env=env, timeout=240)
    ranks = load_pickled_ranks(out_dir, n)
    shapes = [a.shape for a in ranks[0]["inputs"][0]]
    ref = PowerSGD(n, shapes, rank_r, START, random_seed=7, draw=numpy_draw)

    def near(got: np.ndarray, want: np.ndarray, what: str) -> None:
        got = np.asarray(got, np.float64).reshape(-1)[: want.size].reshape(want.shape)
        diff = float(np.abs(got - want).max()) if want.size else 0.0
        assert diff <= 2e-5 * max(1.0, float(np.abs(want).max())), f"{flavour}: {what} off by {diff:.3g}"

    for t in range(STEPS):
        reduced = ref.step([[g.astype(np.float64) for g in got["inputs"][t]] for got in ranks])
        for r, got in enumerate(ranks):
            step = got["steps"][t]
            assert int(step["powersgd_iter"]) == t + 1, f"{flavour}, rank {r}: step count {step['powersgd_iter']}"
            for i, want in enumerate(reduced):
                near(step["reduced"][i], want, f"rank {r}, step {t}, gradient {i}")
            if t >= START:
                flat = [np.concatenate([x.reshape(-1) for x in xs]) for xs in (ref.errors[r], ref.ps, ref.qs)]
                for key, want in zip(("powersgd_error", "powersgd_p", "powersgd_q"), flat, strict=True):
                    near(step[key], want, f"rank {r}, step {t}, {key}")
            for i, (a, b) in enumerate(zip(step["values"], ranks[0]["steps"][t]["values"], strict=True)):
                assert np.array_equal(a, b), f"{flavour}, step {t}: rank {r} variable {i} differs from rank 0's"
    for r, got in enumerate(ranks):
        assert got["per_rank"] == ["hvdc_powersgd_error"] or all("powersgd_error" in n for n in got["per_rank"]), \
            f"{flavour}, rank {r}: per-rank variables {got['per_rank']}"
        for t, (a, b) in enumerate(zip(got["resumed"], got["steps"][RESUME_AT:], strict=True)):
            where = f"{flavour}, rank {r}, resumed at step {RESUME_AT}, step {RESUME_AT + t}"
            for i, (x, y) in enumerate(zip(a["values"], b["values"], strict=True)):
                assert np.array_equal(x, y), f"{where}: variable {i} differs by {float(np.abs(x - y).max()):.3g}"
            for key in ("powersgd_error", "powersgd_p", "powersgd_q", "powersgd_rng"):
                assert np.array_equal(a[key], b[key]), f"{where}: {key} differs"
        bad = got["bad"]
        for case, (kind, text) in {"rank0": ("ValueError", "matrix_approximation_rank"),
                                   "unknown": ("TypeError", "start_powerSGD_iter"),
                                   "bucket_mb": ("TypeError", "bucket_mb"),
                                   "topk": ("ValueError", "needs op=Average or Sum")}.items():
            assert bad[case].startswith(kind) and text in bad[case], f"{flavour}, rank {r}, {case}: {bad[case]}"


def test_keras_matrix_work_against_reference_with_a_zero_matrix_and_an_inf() -> None:
    """The Keras faces' matrix work (``NumpyMatrices``) under ``reduce_bucket`` in one process (one rank, so the
    allreduces change nothing) against the reference: a matrix whose gradient is zero for the first compressed steps
    gets a zero result and keeps its Q (Gram-Schmidt at r = 1 would divide 0 by 0), then trains; a step with an inf
    hands it on and leaves the error, P and Q as they were."""
    from hvd_compress.algorithms.powersgd import PowerSGDOptions, PowerSGDState, reduce_bucket
    from hvd_compress.tensorflow.powersgd import NumpyMatrices

    shapes = [(12, 10), (10,), (8, 9)]
    state = PowerSGDState(PowerSGDOptions(matrix_approximation_rank=1, start_powerSGD_iter=1, random_seed=7))
    ref = PowerSGD(1, shapes, 1, 1, random_seed=7, draw=numpy_draw)
    rng = np.random.default_rng(0)
    for t in range(7):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        if t < 3:
            grads[0][...] = 0
        if t == 5:
            grads[2][0, 0] = np.inf
        flat = np.concatenate([g.reshape(-1) for g in grads])
        reduce_bucket(NumpyMatrices(), state, 0, flat, shapes, lambda tensor, average, what: None)
        state.step_done()
        want = np.concatenate([w.reshape(-1) for w in ref.step([[g.astype(np.float64) for g in grads]])])
        assert np.array_equal(np.isfinite(flat), np.isfinite(want)), f"step {t}: not finite where the reference is"
        finite = np.isfinite(want)
        assert np.abs(flat[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max(), f"step {t}"
        assert (flat[:120] == 0).all() == (t < 3), f"step {t}: the zero matrix's result"
        if t >= 1:
            for got, arrays in ((state.errors[0], ref.errors[0]), (state.p_memory[0], ref.ps),
                                (state.q_memory[0], ref.qs)):
                expect = np.concatenate([a.reshape(-1) for a in arrays])
                assert np.abs(got - expect).max() <= 1e-5 * max(1.0, np.abs(expect).max()), f"step {t}"
