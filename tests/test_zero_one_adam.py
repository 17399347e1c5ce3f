"""hc.DistributedOptimizer(op=ZeroOneAdam) on real MPI processes (2, 3 and 4 ranks) against the NumPy reference
hvd_compress.reference.zero_one_adam, element by element at every step, over variance steps, 1-bit gradient steps,
the freeze and three doublings of the local-step interval; checkpoint resume bit for bit; bad input refused on
every rank; an lr schedule through 0 and a 10x drop (spec Z21). One launch per rank count serves all tests of that
count (module-scoped). The Keras 3 and tf_keras faces against the same reference, each at 2 and 3 ranks."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi_harness import load_pickled_ranks, load_ranks, mpirun
from workers.common import rank_input

from hvd_compress.reference import zero_one_adam as z
from hvd_compress.reference.dtypes import ulp

SIZES = [13, 30, 7]  # 50 elements: not a multiple of 8 * n; the 7 are a second param group (bucket)
BUCKET_SLICES = [slice(0, 43), slice(43, 50)]
LAYERS = [SIZES[:-1], SIZES[-1:]]  # the variance floor's layers in each bucket
STEPS = 32
# Variance steps 1, 2, 3, 5, 7, 1-bit steps 4, 6, 8-10, freeze after 10; syncs at 11, 12, 13, 15, 23, 31 (the
# interval doubles 1 -> 2 -> 4 -> 8, clipped there); local steps in between.
OPTIONS = {"var_freeze_step": 10, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 8}
# Spec Z21, one lr per step (1-based): 0 at the variance step 5 and the 1-bit step 6; 0.01 again; 0 over the whole
# intervals of the syncs at 13 and 15, whose errors the syncs at 11 and 12 left at 0.01; 0.01 again; a tenth of it
# from step 24 (the sync at 31 sends what the sync at 23 left at 0.01). Run at 2 and 3 ranks and by the Keras faces.
LR_SCHEDULE = [0.0 if t in (5, 6, 13, 14, 15) else 0.001 if t >= 24 else 0.01 for t in range(1, STEPS + 1)]
SCHEDULED = (2, 3)
# The 2-rank launch also trains a small ReLU MLP with op=ZeroOneAdam's defaults and var_freeze_step 3 (n_v = 3).
TRAIN_STEPS = 40
# n -> (overlap, the step the run restarts from its checkpoint after, whether the bad-input checks run)
LAUNCHES = {2: ("1", 7, False), 3: ("0", 10, True), 4: ("1", 17, False)}
# The 3-rank run divides v by 1 - b2^n_v (variance_bias_correction, the default), the 4-rank run does not and zeroes
# m after each sync (reset_momentum_at_sync); the 2-rank run is DeepSpeed's rule.
EXTRA = {2: {"variance_bias_correction": False}, 3: {"variance_bias_correction": True},
         4: {"variance_bias_correction": False, "reset_momentum_at_sync": True}}
# The Keras launches: name -> (flavour, ranks, options beyond OPTIONS). Keras 3 runs DeepSpeed's rule at 2 ranks and
# both of our options at 3; tf_keras the defaults at 2 and DeepSpeed's rule with the reset at 3. Each also runs
# LR_SCHEDULE.
KERAS_LAUNCHES = {"keras": ("keras", 2, {"variance_bias_correction": False}),
                  "keras_corrected_reset": ("keras", 3, {"variance_bias_correction": True,
                                                         "reset_momentum_at_sync": True}),
                  "tf_keras_defaults": ("tf_keras", 2, {}),
                  "tf_keras": ("tf_keras", 3, {"variance_bias_correction": False, "reset_momentum_at_sync": True})}
# Keras: a second run halves the first variable before the 18th step (a local step) on every rank, which the step
# sees, calls synchronize_parameters() before the 26th (local) and shifts the second on rank 1 before the 23rd (a
# sync step: its exchange is redone) (spec Z20).
KERAS_EDITS = (17, 25, 22)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict]]:
    done: dict[int, list[dict]] = {}

    def get(n: int) -> list[dict]:
        if n not in done:
            overlap, stop, bad = LAUNCHES[n]
            out: Path = tmp_path_factory.mktemp(f"zero_one_adam{n}")
            opts = ",".join(f"{k}={int(v)}" for k, v in {**OPTIONS, **EXTRA.get(n, {})}.items()) + f",stops={stop}"
            if n in SCHEDULED:
                opts += ",lrs=" + ":".join(map(str, LR_SCHEDULE))
            if n == 2:
                opts += f",trains={TRAIN_STEPS}"
            mpirun("zero_one_adam.py", n, out, "match+bad" if bad else "match", str(STEPS),
                   ",".join(map(str, SIZES)), opts, overlap, timeout=300)
            done[n] = load_ranks(out, n)
        return done[n]

    return get


def _reference(n: int, lrs: list[float]) -> tuple[np.ndarray, list[str]]:
    """Every rank's parameters after every step (steps x n x numel), each bucket its own run, and the kinds."""
    total = sum(SIZES)
    x0 = rank_input(0, total, torch.float32, seed=777).double().numpy()
    grads = [[rank_input(r, total, torch.float32, seed=t + 1).double().numpy() for r in range(n)]
             for t in range(STEPS)]
    want = np.zeros((STEPS, n, total))
    for sl, layers in zip(BUCKET_SLICES, LAYERS, strict=True):
        trace = z.zero_one_adam(x0[sl], [[g[sl] for g in step] for step in grads], lrs, weight_decay=0.05,
                                sizes=layers, **OPTIONS, **EXTRA.get(n, {}))
        for t in range(STEPS):
            for r in range(n):
                want[t, r, sl] = trace.params[t][r]
    return want, trace.kinds


def test_reset_momentum_at_sync_changes_the_reference_from_the_step_after_the_first_sync() -> None:
    """Z18 in the reference: the same run through the first sync, then m = 0 tells on the next step, local or sync
    (both form m_r from m), so the 4-rank and tf_keras comparisons would catch an implementation ignoring it."""
    total, n = sum(SIZES), 2
    x0 = rank_input(0, total, torch.float32, seed=777).double().numpy()
    grads = [[rank_input(r, total, torch.float32, seed=t + 1).double().numpy() for r in range(n)] for t in range(STEPS)]
    plain, reset = (z.zero_one_adam(x0, grads, 0.01, **OPTIONS, reset_momentum_at_sync=flag) for flag in (False, True))
    after_sync = plain.kinds.index("sync") + 1
    for t in range(after_sync):
        assert all(np.array_equal(a, b) for a, b in zip(plain.params[t], reset.params[t], strict=True)), t
    assert not np.allclose(plain.params[after_sync][0], reset.params[after_sync][0], rtol=0, atol=1e-6)


def _assert_matches(got: np.ndarray, want: np.ndarray, what: str, kinds: list[str]) -> None:
    """float32 against float64, element by element at every step: a few roundings per step taken, in ulps of the
    element (at least 0.1: x_anchor - ubar / d cancels near zero, lr 0.01 times m / d up to ~10 without bias
    correction); an element near 0 also carries a rounding of the step's largest terms, up to 4 ulps of its largest
    |x| (x_anchor - ubar / d, the decay). The error stays bounded over the run; a wrong rule is off by > 1e-4."""
    for t in range(len(want)):
        floor = 4.0 * ulp(np.abs(want[t]).max(), "float32")
        tol = np.maximum(4.0 * (t + 1) * ulp(np.maximum(np.abs(want[t]), 0.1), "float32"), floor)
        assert np.isfinite(want[t]).all(), f"{what} step {t + 1} ({kinds[t]}): the reference is not finite"
        err = np.abs(got[t] - want[t])
        bad = np.flatnonzero(~(err <= tol))  # a NaN is off
        assert bad.size == 0, (
            f"{what} step {t + 1} ({kinds[t]}): {bad.size} element(s) off the reference, first {bad[0]}: "
            f"got {got[t][bad[0]]!r}, reference {want[t][bad[0]]!r} (tolerance {tol[bad[0]]:.3g})")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_step_matches_the_reference_on_every_rank(runs, n: int) -> None:
    ranks = runs(n)
    lrs = ranks[0]["lrs"]
    assert lrs[0] > lrs[-1], "the LR scheduler did not act"
    want, kinds = _reference(n, lrs)
    assert ranks[0]["kinds"] == kinds
    assert {"variance", "onebit", "sync", "local"} == set(kinds)
    for r, rk in enumerate(ranks):
        _assert_matches(torch.stack(rk["trace"]).double().numpy(), want[:, r], f"n={n} rank {r}", kinds)


def _assert_lr_zero_moves_nothing(got: np.ndarray, lrs: list[float], kinds: list[str], what: str) -> None:
    """Bit for bit the parameters of the step before, at every step whose lr is 0 (its sync interval's too)."""
    for t, lr in enumerate(lrs):
        if lr == 0:
            moved = np.abs(got[t] - got[t - 1]).max()
            assert moved == 0, f"{what}: lr 0 at step {t + 1} ({kinds[t]}) moved a parameter by {moved:.3g}"


@pytest.mark.parametrize("n", SCHEDULED)
def test_the_carried_error_follows_the_lr_and_lr_zero_moves_nothing(runs, n: int) -> None:
    """Spec Z21: the lr dropped to 0 over variance, 1-bit, sync and local steps, restored, then dropped 10x: at lr 0
    no parameter moves, though two syncs at 0.01 left their errors, and every step matches the reference, whose
    errors follow the lr (kept in the old lr's units, the first sync at 0 moves x and the 10x drop steps as 0.01)."""
    want, kinds = _reference(n, LR_SCHEDULE)
    assert [kinds[t] for t in (4, 5, 12, 13, 14)] == ["variance", "onebit", "sync", "local", "sync"], kinds
    for r, rk in enumerate(runs(n)):
        got = torch.stack(rk["scheduled"]).double().numpy()
        _assert_lr_zero_moves_nothing(got, LR_SCHEDULE, kinds, f"n={n} rank {r}")
        _assert_matches(got, want[:, r], f"n={n} rank {r}, lr schedule", kinds)


def test_the_default_options_train_a_relu_mlp_after_a_short_freeze(runs) -> None:
    """The default variance_bias_correction=True (spec Z17): frozen after 3 variance updates, the uncorrected v
    (DeepSpeed's rule) steps 18 times a corrected Adam's and ends in a non-finite gradient within 20 steps here; the
    default keeps every loss finite and cuts the first step's loss by 30% or more in 40 steps, on every rank."""
    for r, rk in enumerate(runs(2)):
        got = rk["trains"]
        assert got["error"] is None, f"rank {r}: {got['error']}"
        losses = got["losses"]
        assert len(losses) == TRAIN_STEPS and all(math.isfinite(v) for v in losses), f"rank {r}: {losses}"
        assert losses[-1] < 0.7 * losses[0], f"rank {r}: loss {losses[0]:.4f} -> {losses[-1]:.4f}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ranks_hold_identical_parameters_after_every_step_but_local_ones(runs, n: int) -> None:
    ranks = runs(n)
    for t, kind in enumerate(ranks[0]["kinds"]):
        distinct = len({rk["hashes"][t] for rk in ranks})
        if kind == "local":  # each rank stepped on its own gradient
            assert distinct == n, f"n={n} step {t + 1} (local): only {distinct} distinct parameter sets"
        else:
            assert distinct == 1, f"n={n} step {t + 1} ({kind}): ranks differ"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_resume_from_a_checkpoint_is_bit_identical(runs, n: int) -> None:
    """Restarted after step 7 (phase 1), 10 (the freeze; the next step is the first sync) or 17 (inside a local
    interval) in fresh objects: every later step's parameters, and the final m, u, x_anchor, errors and lrs."""
    ranks = runs(n)
    stop = LAUNCHES[n][1]
    for r, rk in enumerate(ranks):
        resumed = rk["resumed"][stop]
        assert resumed["kinds"] == rk["kinds"][stop:], f"rank {r}: the schedule did not resume"
        for t, (a, b) in enumerate(zip(rk["hashes"][stop:], resumed["hashes"], strict=True)):
            assert a == b, f"n={n} rank {r}: the run resumed after step {stop} differs at step {stop + t + 1}"
        assert resumed["final_state"] == rk["final_state"], f"n={n} rank {r}: the resumed run's state differs"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_an_uncorrected_v_frozen_after_few_updates_is_warned_of_on_every_rank_once(runs, n: int) -> None:
    """Five variance updates before the freeze: DeepSpeed's uncorrected v (2 and 4 ranks) steps 1 / sqrt(1 -
    0.999^5) = 14.2 times a corrected Adam's, said once on every rank; with the correction (3 ranks) nothing. A run
    resumed before the freeze (2 ranks, after step 7) says it at the freeze, one resumed past it (4 ranks, after
    step 17) on its first step: once each."""
    want = 0 if EXTRA.get(n, {}).get("variance_bias_correction") else 1
    stop = LAUNCHES[n][1]
    for r, rk in enumerate(runs(n)):
        for what, warned in (("the run", rk["warned"]), (f"resumed after {stop}", rk["resumed"][stop]["warned"])):
            assert len(warned) == want, f"n={n} rank {r}, {what}: warned {warned}"
            if want:
                assert "after 5 variance updates" in warned[0] and "14.2 times" in warned[0], warned
                assert "variance_bias_correction=True" in warned[0]


def test_step_inflation_is_one_over_the_root_of_the_bias_correction() -> None:
    from hvd_compress.algorithms.zero_one_adam import step_inflation

    assert step_inflation(0.999, 15) == pytest.approx(8.2, abs=0.05)
    assert step_inflation(0.999, 201) == pytest.approx(2.34, abs=0.01)  # DeepSpeed's defaults (n_v 201): not warned
    assert step_inflation(0.999, 0) == float("inf") and step_inflation(0.0, 1) == 1.0


def test_bytes_per_step_follow_the_step_kind(runs) -> None:
    """A local step sends only its small agreement (finite gradients, changed parameters: Z16, Z20); 1-bit
    gradient and sync steps the same 1-bit payload, a sync step also the agreement on changed parameters; a
    variance step the dense average."""
    rk = runs(2)[0]
    sent: dict[str, set[int]] = {}
    for kind, stats in zip(rk["kinds"], rk["stats"], strict=True):
        sent.setdefault(kind, set()).add(stats["bytes_sent"])
    assert all(len(v) == 1 for v in sent.values()), sent
    onebit, agreement = min(sent["onebit"]), min(sent["local"])
    assert onebit < min(sent["sync"]) <= onebit + agreement, sent
    assert agreement < onebit < min(sent["variance"]), sent


def test_bad_input_raises_on_every_rank_and_changes_nothing(runs) -> None:
    ranks = runs(3)
    expected = {
        "unknown_option": "TypeError: op=ZeroOneAdam got unknown options ['freeze_step']; it takes var_freeze_step",
        "negative_freeze": "ValueError: op=ZeroOneAdam: var_freeze_step must be an int >= 0",
        "zero_clipper": "ValueError: op=ZeroOneAdam: local_step_clipper must be an int >= 1",
        "float_scaler": "ValueError: op=ZeroOneAdam: var_update_scaler must be an int >= 1",
        "negative_floor": "ValueError: op=ZeroOneAdam: variance_floor must be a finite number >= 0",
        "string_correction": "ValueError: op=ZeroOneAdam: variance_bias_correction must be True or False",
        "int_reset": "ValueError: op=ZeroOneAdam: reset_momentum_at_sync must be True or False",
        "sgd": "TypeError: op=ZeroOneAdam wraps torch.optim.Adam or AdamW",
        "adam_l2": "ValueError: op=ZeroOneAdam decays weights decoupled",
        "amsgrad": "ValueError: op=ZeroOneAdam does not support amsgrad",
        "onebit_checkpoint": "ValueError: ZeroOneAdam.load_state_dict: the checkpoint is for op=OneBitAdam, not "
                             "op=ZeroOneAdam",
        "powersgd_checkpoint": "ValueError: ZeroOneAdam.load_state_dict: the checkpoint is for op=PowerSGD, not "
                               "op=ZeroOneAdam",
        "nan_variance": "UsageError: ZeroOneAdam: non-finite averaged gradient at step 1",
        "nan_onebit": "UsageError: ZeroOneAdam: step 4 rejected on every rank",
        "nan_sync": "UsageError: ZeroOneAdam: step 5 rejected on every rank",
        "nan_local": "UsageError: ZeroOneAdam: non-finite gradient on some rank at step 6",
        "negative_lr": "ValueError: op=ZeroOneAdam: need lr >= 0",
        "plain_checkpoint_phase2": "ValueError: ZeroOneAdam: the optimizer state (step 9) has no 'hvd_compress'",
        "after": "no error",
    }
    for r, rk in enumerate(ranks):
        got = rk["bad"]
        for key, prefix in expected.items():
            assert got[key].startswith(prefix), f"rank {r}, {key}: {got[key]}"
        for key in ("nan_variance", "nan_onebit", "nan_sync", "nan_local", "negative_lr"):
            assert got[f"{key}_unchanged"] == "True", f"rank {r}, {key}: the state changed"
        assert got["step"] == 11, f"rank {r}: {got['step']} steps taken, 11 good ones given"
        assert torch.equal(got["final"], ranks[0]["bad"]["final"]), f"rank {r}: parameters differ from rank 0's"


def _f32(a: float) -> float:
    return float(np.float32(a))


@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[dict]]:
    """One launch of keras_zero_one_adam.py per entry of KERAS_LAUNCHES, for every test of that entry."""
    done: dict[str, list[dict]] = {}

    def get(name: str) -> list[dict]:
        if name not in done:
            flavour, n, extra = KERAS_LAUNCHES[name]
            out_dir = tmp_path_factory.mktemp(f"keras_zero_one_adam_{name}")
            opts = ",".join(f"{k}={int(v)}" for k, v in {**OPTIONS, **extra}.items())
            mpirun("keras_zero_one_adam.py", n, out_dir, str(STEPS), ",".join(map(str, SIZES)), opts,
                   ",".join(map(str, KERAS_EDITS)), ":".join(map(str, LR_SCHEDULE)), timeout=300,
                   env={"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else None)
            done[name] = load_pickled_ranks(out_dir, n)
        return done[name]

    return get


@pytest.mark.parametrize("name", list(KERAS_LAUNCHES))
def test_keras_faces_match_the_reference_on_every_rank(name: str, keras_runs: Callable[[str], list[dict]]) -> None:
    """keras.optimizers.AdamW (or tf_keras's) under hck.DistributedOptimizer(op=hck.ZeroOneAdam), given gradients,
    at 2, 3 and 4 ranks. The TF faces hand the hyper-parameters over as float64 casts of float32 tensors: the
    reference takes those."""
    flavour, n, extra = KERAS_LAUNCHES[name]
    total, ranks = sum(SIZES), keras_runs(name)
    assert len(ranks) == n
    assert ranks[0]["legacy"] == (flavour == "tf_keras")

    def given(seed: int, rank: int) -> np.ndarray:
        return np.random.default_rng(1000 * seed + rank).standard_normal(total).astype(np.float32).astype(np.float64)

    grads = [[given(t + 1, r) for r in range(n)] for t in range(STEPS)]
    # One bucket: the TF faces cut one bucket of all variables below 1 MiB.
    trace = z.zero_one_adam(given(777, 0), grads, _f32(0.01), betas=(_f32(0.9), _f32(0.999)), eps=_f32(1e-8),
                            weight_decay=_f32(0.05), sizes=SIZES, **OPTIONS, **extra)
    for t, kind in enumerate(trace.kinds):
        distinct = len({rk["hashes"][t] for rk in ranks})
        assert distinct == (n if kind == "local" else 1), f"{name} step {t + 1} ({kind}): {distinct} parameter sets"
    for r, rk in enumerate(ranks):
        want = np.stack([p[r] for p in trace.params])
        _assert_matches(np.stack(rk["trace"]).astype(np.float64), want, f"{name} rank {r}", trace.kinds)
    opts = z.Options(betas=(_f32(0.9), _f32(0.999)), eps=_f32(1e-8), weight_decay=_f32(0.05), **OPTIONS, **extra)
    st, want = z.ZeroOneAdamState.zeros(given(777, 0), n), []
    for t in range(STEPS):
        if t in KERAS_EDITS:
            assert trace.kinds[t] == ("sync" if t == KERAS_EDITS[2] else "local"), t
            if t == KERAS_EDITS[0]:
                st.x = [np.concatenate([x[:SIZES[0]] * 0.5, x[SIZES[0]:]]) for x in st.x]
            if t == KERAS_EDITS[2]:
                v1 = slice(SIZES[0], SIZES[0] + SIZES[1])
                st.x[1][v1] = (st.x[1][v1].astype(np.float32) + np.float32(0.25)).astype(np.float64)
            z.synchronize_parameters(st, opts)
        z.step(st, grads[t], _f32(0.01), opts, SIZES)
        want.append([x.copy() for x in st.x])
    for r, rk in enumerate(ranks):
        _assert_matches(np.stack(rk["edited"]).astype(np.float64), np.stack([w[r] for w in want]),
                        f"{name} rank {r}, edited", trace.kinds)


@pytest.mark.parametrize("name", list(KERAS_LAUNCHES))
def test_keras_faces_errors_follow_the_lr_and_lr_zero_moves_nothing(name: str,
                                                                     keras_runs: Callable[[str], list[dict]]) -> None:
    """Spec Z21 in the Keras faces: the wrapper's ``learning_rate`` set before each step as ``LearningRateScheduler``
    sets it, LR_SCHEDULE (0, restored, a 10x drop): no movement at lr 0 and the reference at every step."""
    _, n, extra = KERAS_LAUNCHES[name]
    total = sum(SIZES)

    def given(seed: int, rank: int) -> np.ndarray:
        return np.random.default_rng(1000 * seed + rank).standard_normal(total).astype(np.float32).astype(np.float64)

    lrs = [_f32(lr) for lr in LR_SCHEDULE]
    grads = [[given(t + 1, r) for r in range(n)] for t in range(STEPS)]
    trace = z.zero_one_adam(given(777, 0), grads, lrs, betas=(_f32(0.9), _f32(0.999)), eps=_f32(1e-8),
                            weight_decay=_f32(0.05), sizes=SIZES, **OPTIONS, **extra)
    for r, rk in enumerate(keras_runs(name)):
        got = np.stack(rk["scheduled"]).astype(np.float64)
        _assert_lr_zero_moves_nothing(got, lrs, trace.kinds, f"{name} rank {r}")
        _assert_matches(got, np.stack([p[r] for p in trace.params]), f"{name} rank {r}, lr schedule", trace.kinds)


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
def test_keras_faces_refuse_lamb_options_around_adam_on_every_rank(flavour: str,
                                                                   keras_runs: Callable[[str], list[dict]]) -> None:
    """LAMB's options (min_coeff, max_coeff, bias_correction) with op=OneBitAdam or ZeroOneAdam around an AdamW would
    change nothing: a TypeError naming the option at construction on every rank, as the torch face raises. Keras 3's
    op=OneBitLamb wraps a Lamb only; tf_keras has none, so there an Adam supplies LAMB's hyper-parameters and the
    LAMB options are taken."""
    for r, rk in enumerate(keras_runs(flavour)):
        assert sorted(rk["lamb_options"]) == sorted((op, option) for op in ("OneBitAdam", "ZeroOneAdam")
                                                    for option in ("min_coeff", "max_coeff", "bias_correction"))
        for (op, option), got in rk["lamb_options"].items():
            assert got.startswith(f"TypeError: op={op} got unknown options ['{option}']"), \
                f"{flavour} rank {r}, op={op} with {option}: {got}"
        want = "no error" if flavour == "tf_keras" else "TypeError: op=OneBitLamb wraps keras.optimizers.Lamb, got Adam"
        assert rk["lamb_over_adam"] == want, f"{flavour} rank {r}, op=OneBitLamb around Adam: {rk['lamb_over_adam']}"


#: What each op's constructor names as the optimizers it wraps, per Keras face (docs: each op's page).
TORCH_WRAPS = {"OneBitAdam": "torch.optim.Adam or AdamW", "ZeroOneAdam": "torch.optim.Adam or AdamW",
               "OneBitLamb": "hc.Lamb", "SLAMB": "hc.Lamb", "Birder": "hc.Birder", "SignSGD": "torch.optim.SGD"}


@pytest.mark.parametrize("n", SCHEDULED)
def test_torch_face_refuses_an_inner_optimizer_of_another_kind_on_every_rank(runs, n: int) -> None:
    """Each op around an optimizer it does not wrap (1-bit Adam and 0/1 Adam around hc.Lamb or hc.Birder, 1-bit LAMB
    and SLAMB around Adam or hc.Birder, Birder around Adam or hc.Lamb, SignSGD around Adam): a TypeError at
    construction on every rank naming what the op wraps and what it got."""
    for r, rk in enumerate(runs(n)):
        got = rk["inner_mismatch"]
        assert len(got) == 11, f"n={n} rank {r}: {sorted(got)}"
        for (op, inner), said in got.items():
            assert said == f"TypeError: op={op} wraps {TORCH_WRAPS[op]}, got {inner}", (
                f"n={n} rank {r}, op={op} around {inner}: {said}")


ADAM_3, ADAM_TF = "keras.optimizers.Adam or AdamW", "tf_keras.optimizers.Adam/AdamW"
KERAS_WRAPS = {"keras": {"OneBitAdam": ADAM_3, "ZeroOneAdam": ADAM_3, "OneBitLamb": "keras.optimizers.Lamb",
                         "SLAMB": "keras.optimizers.Lamb", "Birder": "hck.Birder"},
               "tf_keras": {"OneBitAdam": ADAM_TF, "ZeroOneAdam": ADAM_TF, "OneBitLamb": ADAM_TF, "SLAMB": ADAM_TF,
                            "Birder": "hvd_compress.keras.legacy.Birder"}}


@pytest.mark.parametrize("name", ["keras", "tf_keras"])
def test_keras_faces_refuse_an_inner_optimizer_of_another_kind_on_every_rank(
        name: str, keras_runs: Callable[[str], list[dict]]) -> None:
    """Each op around an optimizer it does not wrap (Keras 3: 1-bit Adam and 0/1 Adam around a Lamb or a Birder, 1-bit
    LAMB and SLAMB around an AdamW or a Birder, Birder around an AdamW or a Lamb; tf_keras, which has no Lamb, each
    op around the other of its Adam and Birder): a TypeError at construction on every rank naming what the op wraps
    and what it got, never a run of one rule on another optimizer's hyper-parameters."""
    flavour = KERAS_LAUNCHES[name][0]
    want = 10 if flavour == "keras" else 5
    for r, rk in enumerate(keras_runs(name)):
        got = rk["inner_mismatch"]
        assert len(got) == want, f"{name} rank {r}: {sorted(got)}"
        for (op, inner), said in got.items():
            wraps = KERAS_WRAPS[flavour][op]
            assert said.startswith("TypeError: op=") and f"wraps {wraps}" in said and f"got {inner}" in said, (
                f"{name} rank {r}, op={op} around {inner}: {said}")
