"""The NumPy reference of 0/1 Adam (hvd_compress.reference.zero_one_adam; docs/algorithms/zero-one-adam-spec.md)
on its own, single process: its schedules, its identities with plain Adam, checkpoint resume, and training."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hvd_compress.reference import zero_one_adam as z


def _steps_of(kinds: list[str], *wanted: str) -> list[int]:
    return [t + 1 for t, k in enumerate(kinds) if k in wanted]


def test_variance_is_updated_on_deepspeeds_doubling_schedule() -> None:
    # kappa = 2: interval 1 for 2 updates, then 2, 4, 8 (DeepSpeed's counter s = t + 1 decides: spec S1, Z1).
    assert _steps_of(z.schedule(20, var_update_scaler=2), z.VARIANCE) == [1, 2, 3, 5, 7, 11, 15]
    # The default kappa = 16: steps 1-16 every step, then every odd step (s even) up to 47, then t = 51, 55, ...
    kinds = z.schedule(60)
    assert _steps_of(kinds, z.VARIANCE) == list(range(1, 17)) + list(range(17, 48, 2)) + [51, 55, 59]
    assert _steps_of(kinds, z.LOCAL, z.SYNC) == []
    # Nothing updates the variance after var_freeze_step.
    kinds = z.schedule(30, var_update_scaler=2, var_freeze_step=10)
    assert _steps_of(kinds, z.VARIANCE) == [1, 2, 3, 5, 7]
    assert _steps_of(kinds, z.ONEBIT) == [4, 6, 8, 9, 10]
    assert _steps_of(kinds, z.SYNC, z.LOCAL) == list(range(11, 31))


def test_syncs_double_their_interval_every_local_step_scaler_steps_up_to_the_clipper() -> None:
    kinds = z.schedule(20, var_freeze_step=4, var_update_scaler=100, local_step_scaler=2, local_step_clipper=4)
    assert _steps_of(kinds, z.VARIANCE) == [1, 2, 3, 4]
    # Phase 2 from t = 5: interval 1 for 2 steps, 2 for 2 steps, then 4 (clipped), on multiples of s = t + 1.
    assert _steps_of(kinds, z.SYNC) == [5, 6, 7, 11, 15, 19]
    assert _steps_of(kinds, z.LOCAL) == [8, 9, 10, 12, 13, 14, 16, 17, 18, 20]
    # local_step_scaler=1 with clipper H gives a constant interval H once it has doubled up to it (tutorial).
    kinds = z.schedule(24, var_freeze_step=0, local_step_scaler=1, local_step_clipper=4)
    assert _steps_of(kinds, z.SYNC) == [1, 3, 7, 11, 15, 19, 23]


def _plain_adam(x0: np.ndarray, grads: list[list[np.ndarray]], lr: list[float], betas: tuple[float, float],
                eps: float, wd: float, freeze: int | None = None) -> list[np.ndarray]:
    """Adam on the rank-averaged gradient, no bias correction, decoupled decay; v frozen after step ``freeze``."""
    b1, b2 = betas
    x, m, v, out = x0.copy(), np.zeros_like(x0), np.zeros_like(x0), []
    for t, step_grads in enumerate(grads, start=1):
        g = np.mean([np.asarray(gr, dtype=np.float64) for gr in step_grads], axis=0)
        if freeze is None or t <= freeze:
            v = b2 * v + (1 - b2) * g * g
        m = b1 * m + (1 - b1) * g
        x = x - lr[t - 1] * m / (np.sqrt(v) + eps) - lr[t - 1] * wd * x
        out.append(x.copy())
    return out


def _grads(steps: int, n: int, d: int, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(d) * (1 + r) for r in range(n)] for _ in range(steps)]


@pytest.mark.parametrize("n", [1, 3])
def test_dense_phase_is_plain_adam_on_the_averaged_gradient(n: int) -> None:
    steps, d = 30, 37
    grads = _grads(steps, n, d)
    lr = [1e-2 * (1 - t / 60) for t in range(steps)]
    x0 = np.linspace(-1, 1, d)
    opts = {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01}
    # var_update_scaler >= steps keeps the interval at 1: every step of phase 1 is a dense variance step.
    trace = z.zero_one_adam(x0, grads, lr, var_update_scaler=steps, var_freeze_step=steps, variance_floor=0,
                            variance_bias_correction=False, **opts)
    assert set(trace.kinds) == {z.VARIANCE}
    want = _plain_adam(x0, grads, lr, opts["betas"], opts["eps"], opts["weight_decay"])
    for t in range(steps):
        for r in range(n):
            err = np.max(np.abs(trace.params[t][r] - want[t]))
            assert err <= 1e-14, f"n={n} step {t + 1} rank {r}: off plain Adam by {err:.3g}"


def test_one_rank_without_compression_error_interval_one_is_adam_with_frozen_variance() -> None:
    steps, d, freeze = 40, 21, 12
    grads = _grads(steps, 1, d, seed=3)
    lr = [5e-3] * steps
    x0 = np.linspace(0.5, -0.5, d)
    trace = z.zero_one_adam(x0, grads, lr, var_update_scaler=steps, var_freeze_step=freeze, local_step_scaler=10**6,
                            compress=False, weight_decay=0.02, variance_floor=0, variance_bias_correction=False)
    assert _steps_of(trace.kinds, z.SYNC) == list(range(freeze + 1, steps + 1))
    want = _plain_adam(x0, grads, lr, (0.9, 0.999), 1e-8, 0.02, freeze=freeze)
    for t in range(steps):
        err = np.max(np.abs(trace.params[t][0] - want[t]))
        assert err <= 1e-13, f"step {t + 1}: off Adam with frozen v by {err:.3g}"


def test_one_rank_without_compression_error_a_sync_lands_where_the_local_steps_went() -> None:
    # L4-L6 at n = 1 with exact averaging and no decay: theta_{t'} - u / d is the last local point, and the momentum
    # becomes the lr-weighted mean of the interval's local momenta (L5), with a varying lr.
    d, steps = 17, 30
    grads = _grads(steps, 1, d, seed=5)
    lr = [1e-2 / (1 + 0.1 * t) for t in range(steps)]
    opts = z.Options(var_freeze_step=3, var_update_scaler=100, local_step_scaler=2, local_step_clipper=8,
                     compress=False, variance_floor=0, variance_bias_correction=False)
    st = z.ZeroOneAdamState.zeros(np.linspace(-1, 1, d), 1)
    b1 = opts.betas[0]
    local_m, local_lr = [], []
    syncs = 0
    for t in range(steps):
        x_old, m_old, dnm = st.x[0].copy(), st.m[0].copy(), np.sqrt(st.v) + opts.eps
        kind = z.step(st, grads[t], lr[t], opts)
        if kind not in (z.LOCAL, z.SYNC):
            continue
        m_local = b1 * m_old + (1 - b1) * grads[t][0]
        local_m.append(m_local)
        local_lr.append(lr[t])
        step_err = np.max(np.abs(st.x[0] - (x_old - lr[t] * m_local / dnm)))
        assert step_err <= 1e-13, f"step {t + 1} ({kind}): off the local step by {step_err:.3g}"
        if kind == z.SYNC:
            syncs += 1
            want_m = sum(a * m for a, m in zip(local_lr, local_m, strict=True)) / sum(local_lr)
            m_err = np.max(np.abs(st.m[0] - want_m))
            assert m_err <= 1e-13, f"step {t + 1}: momentum off the lr-weighted mean by {m_err:.3g}"
            assert np.array_equal(st.anchor, st.x[0]) and st.lrs == 0.0 and not st.u[0].any()
            local_m, local_lr = [], []
    assert syncs >= 5 and len(local_m) > 0


def _assert_same_state(got: z.ZeroOneAdamState, want: z.ZeroOneAdamState, where: str) -> None:
    a, b = z.state_dict(got), z.state_dict(want)
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        same = all(np.array_equal(p, q) for p, q in zip(x, y, strict=True)) if isinstance(x, list) else (
            np.array_equal(x, y) and type(x) is type(y))
        assert same, f"{where}: state field {key} differs"


def _resume_options() -> dict[str, object]:
    return {"var_freeze_step": 15, "var_update_scaler": 3, "local_step_scaler": 4, "local_step_clipper": 4,
            "weight_decay": 0.01}


@pytest.mark.parametrize("split", [7, 16, 26])  # phase 1; the first sync; mid-interval
def test_checkpoint_round_trips_and_the_resumed_run_is_bit_identical(split: int) -> None:
    n, d, steps = 3, 45, 40
    grads = _grads(steps, n, d, seed=11)
    lr = [3e-3 * (1 + 0.01 * t) for t in range(steps)]
    x0 = np.linspace(-2, 2, d)
    whole = z.zero_one_adam(x0, grads, lr, **_resume_options())
    first = z.zero_one_adam(x0, grads[:split], lr[:split], **_resume_options())
    saved = pickle.loads(pickle.dumps(z.state_dict(first.state)))
    restored = z.load_state_dict(saved)
    _assert_same_state(restored, first.state, f"split {split}, after the round trip")
    rest = z.zero_one_adam(None, grads[split:], lr[split:], state=restored, **_resume_options())
    assert rest.kinds == whole.kinds[split:]
    for t in range(split, steps):
        for r in range(n):
            assert np.array_equal(rest.params[t - split][r], whole.params[t][r]), f"step {t + 1} rank {r} differs"
    _assert_same_state(rest.state, whole.state, f"split {split}, at the end")
    # The saved state matters: DeepSpeed's load (errors and u dropped, Z13) continues differently.
    at = first.state
    assert any(e.any() for e in at.comp.worker), f"split {split}: no worker error to lose"
    assert (split == 26) == any(u.any() for u in at.u), f"split {split}: u is not what the schedule says"
    dropped = z.load_state_dict(saved)
    dropped.comp = type(dropped.comp).zeros(d, n)
    dropped.u = [np.zeros(d) for _ in range(n)]
    other = z.zero_one_adam(None, grads[split:], lr[split:], state=dropped, **_resume_options())
    assert not np.array_equal(other.params[-1][0], whole.params[-1][0])


def test_ranks_hold_identical_parameters_after_every_step_that_synchronizes() -> None:
    n, d, steps = 4, 50, 60
    trace = z.zero_one_adam(np.zeros(d), _grads(steps, n, d, seed=2), 1e-3, var_freeze_step=20,
                            var_update_scaler=4, local_step_scaler=5, local_step_clipper=8)
    for t, kind in enumerate(trace.kinds):
        same = all(np.array_equal(trace.params[t][0], x) for x in trace.params[t][1:])
        assert same == (kind != z.LOCAL), f"step {t + 1} ({kind}): ranks identical = {same}"


def _least_squares(n: int, d: int, rows: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    x_true = rng.standard_normal(d)
    a = [rng.standard_normal((rows, d)) * (1 + 0.5 * r) for r in range(n)]
    b = [ar @ x_true + 0.05 * rng.standard_normal(rows) for ar in a]
    return a, b


def test_least_squares_at_four_ranks_ends_near_dense_adam() -> None:
    n, d, rows, batch, steps = 4, 64, 256, 32, 1000
    a, b = _least_squares(n, d, rows, seed=0)
    lr = [0.02 * 0.5 * (1 + np.cos(np.pi * t / steps)) for t in range(steps)]

    def loss(x: np.ndarray) -> float:
        return float(np.mean([np.mean((ar @ x - br) ** 2) / 2 for ar, br in zip(a, b, strict=True)]))

    def run(**options: object) -> tuple[float, list[str]]:
        rng = np.random.default_rng(1)  # the same mini-batches for both runs
        opts = z.Options(**options)
        st = z.ZeroOneAdamState.zeros(np.zeros(d), n)
        kinds = []
        for t in range(steps):
            idx = [rng.choice(rows, batch, replace=False) for _ in range(n)]
            g = [a[r][i].T @ (a[r][i] @ st.x[r] - b[r][i]) / batch for r, i in enumerate(idx)]
            kinds.append(z.step(st, g, lr[t], opts))
        return loss(np.mean(st.x, axis=0)), kinds

    initial = loss(np.zeros(d))
    dense, _ = run(var_freeze_step=steps, var_update_scaler=steps, variance_bias_correction=False)
    zoa, kinds = run(var_freeze_step=300, var_update_scaler=16, local_step_scaler=100, local_step_clipper=8,
                     variance_bias_correction=False)
    rounds = sum(k != z.LOCAL for k in kinds)
    assert dense < 1e-2 * initial, f"dense Adam did not converge: {dense:.4g} from {initial:.4g}"
    assert zoa <= dense * 1.02, f"0/1 Adam {zoa:.5g} vs dense Adam {dense:.5g} (initial {initial:.4g})"
    assert kinds.count(z.VARIANCE) < 100 and rounds < steps * 0.6, f"{kinds.count(z.VARIANCE)} dense, {rounds} rounds"


@pytest.mark.parametrize(("name", "value"), [("var_update_scaler", 0), ("local_step_scaler", -1),
                                             ("local_step_clipper", 0), ("var_freeze_step", -1),
                                             ("var_update_scaler", 2.0), ("local_step_clipper", True), ("eps", 0.0),
                                             ("betas", (1.0, 0.999)), ("weight_decay", -0.1),
                                             ("variance_floor", -0.1), ("variance_floor", float("inf"))])
def test_bad_options_raise(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name.split("_", maxsplit=1)[0]):
        z.Options(**{name: value})
