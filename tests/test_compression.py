"""compression= on the dense path (hc.Compression: fp16, bf16, top-k and random-k with error feedback) on real
MPI processes at n = 2, 3, 4, element by element against hvd_compress.reference.compression."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, Cases
from workers.common import DTYPES, rank_input

from hvd_compress.reference import compression as ref

COMPRESSORS = {
    "fp16": ("fp16", 1.0, 0),
    "bf16": ("bf16", 1.0, 0),
    "topk": ("topk", 0.05, 0),
    "randomk": ("randomk", 0.1, 12345678901),
    "topk_dgc": ("topk", 0.05, 0),  # with DGC (momentum, momentum_masking) MOMENTUM[name]
    "topk_dgc_nomask": ("topk", 0.05, 0),
}
MOMENTUM = {"topk_dgc": (0.9, True), "topk_dgc_nomask": (0.9, False)}
STEPS = 3
SEGMENTS = [5, 0, 1000, 94]  # as the worker's fused buffer


def _np(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def _assert_equal(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 0.0) -> None:
    """Bit for bit (rtol 0), or within rtol of the largest |want| (random-k at n >= 3: MPI orders its sum)."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tol = rtol * float(np.max(np.abs(want), initial=0.0))
    err = np.abs(got - want)
    bad = np.flatnonzero(~(err <= tol))
    assert bad.size == 0, (
        f"{what}: {bad.size} element(s) differ from the reference, first at {bad[0]}: got {got[bad[0]]}, "
        f"want {want[bad[0]]} (max error {np.nanmax(err):.3g}, tolerance {tol:.3g})"
    )


def _reference_calls(cname: str, dname: str, numel: int, op: str, n: int, seed_of) -> list:
    """[(result, [error per rank], [velocity per rank] or None)] of STEPS calls, inputs rank_input(rank, numel,
    dtype, seed_of(step))."""
    kind, ratio, seed = COMPRESSORS[cname]
    errors = [np.zeros(numel, np.float32) for _ in range(n)]
    velocities = [np.zeros(numel, np.float32) for _ in range(n)]
    out = []
    for step in range(STEPS):
        xs = [_np(rank_input(r, numel, DTYPES[dname], seed=seed_of(step))) for r in range(n)]
        sizes = SEGMENTS if numel == sum(SEGMENTS) else None
        if kind in ref.WIRE:
            out.append((ref.half_wire_allreduce(xs, dname, kind, op), None, None))
        elif cname in MOMENTUM:
            mu, masking = MOMENTUM[cname]
            result, errors, velocities = ref.topk_momentum_allreduce(xs, errors, velocities, op, ratio, mu, dname,
                                                                     sizes, masking)
            out.append((result, errors, velocities))
        else:
            result, errors = ref.sparse_allreduce(xs, errors, kind, op, ratio, seed, step, dname, sizes)
            out.append((result, errors, None))
    return out


def _modes(n: int) -> tuple[str]:
    return ("collective,optimizer,dgc" + (",bytes" if n == 4 else ""),)


RESUME, BAD, LATE = (2, 4), ((), {}, "compression_bad.py"), ((), {}, "compression_late_momentum.py")
# The workers' cases at one rank count in one launch, the bad input last (3 ranks).
CASES = {n: [_modes(n)] + ([((), {}, "compression_resume.py")] if n in RESUME else [])
         + ([LATE, BAD] if n == 3 else []) for n in (2, 3, 4)}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("compression.py", CASES, tmp_path_factory.mktemp("compression"), timeout_per_case=90)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_compression_matches_reference_with_error_feedback_over_steps(n: int, launched) -> None:
    """At each n: the collective (every compressor, dtype, size, op; STEPS calls with one state), the
    optimizer on a known gradient, and (n = 4) the bytes of one call against dense."""
    ranks = launched.ranks(n, _modes(n))
    _check_collective(ranks, n)
    _check_optimizer(ranks, n)
    _check_dgc(ranks, n)
    if n == 4:
        _check_bytes(ranks[0]["stats"])


def _check_collective(ranks: list[dict], n: int) -> None:
    for key in ranks[0]["results"]:
        cname, dname, numel, op = key
        rtol = 2.0**-21 if cname == "randomk" and n > 2 else 0.0
        want = _reference_calls(cname, dname, numel, op, n, lambda step: 100 * step + 7)
        for step, (result, errors, velocities) in enumerate(want):
            for r in range(n):
                y, err, done, velocity = ranks[r]["results"][key][step]
                what = f"{cname} {dname} numel={numel} {op} n={n} rank {r} call {step}"
                _assert_equal(_np(y), result, what + " result", rtol)
                if errors is not None:
                    _assert_equal(err.double().numpy(), errors[r].astype(np.float64), what + " error", rtol)
                    assert done == step + 1, f"{what}: state step {done}, want {step + 1}"
                assert (velocity is None) == (velocities is None), f"{what}: velocity {velocity is not None}"
                if velocities is not None:
                    _assert_equal(velocity.double().numpy(), velocities[r].astype(np.float64), what + " velocity")
            if rtol == 0.0:  # identical bits on every rank
                bits = {ranks[r]["results"][key][step][0].view(torch.uint8).numpy().tobytes() for r in range(n)}
                assert len(bits) == 1, f"{what}: results differ across ranks"


def _check_optimizer(ranks: list[dict], n: int) -> None:
    """SGD(lr=1, no momentum) on a parameter whose gradient is a known per-rank vector: w_t = w_{t-1} - reduced(g_t)
    (with DGC momentum the reduced g_t carries the momentum)."""
    numel = 2000
    for cname, (kind, ratio, seed) in COMPRESSORS.items():
        w = np.zeros(numel, np.float32)
        errors = [np.zeros(numel, np.float32) for _ in range(n)]
        velocities = [np.zeros(numel, np.float32) for _ in range(n)]
        for step in range(4):
            gs = [_np(rank_input(r, numel, torch.float32, seed=50 + step)) for r in range(n)]
            if kind in ref.WIRE:
                g = ref.half_wire_allreduce(gs, "float32", kind, "Average")
            elif cname in MOMENTUM:
                mu, masking = MOMENTUM[cname]
                g, errors, velocities = ref.topk_momentum_allreduce(gs, errors, velocities, "Average", ratio, mu,
                                                                    "float32", None, masking)
            else:
                g, errors = ref.sparse_allreduce(gs, errors, kind, "Average", ratio, seed, step, "float32")
            w = (w - g.astype(np.float32)).astype(np.float32)
            rtol = 2.0**-20 if kind == "randomk" and n > 2 else 0.0
            for r in range(n):
                _assert_equal(_np(ranks[r]["params"][cname][step]), w.astype(np.float64),
                              f"optimizer {cname} n={n} rank {r} step {step}", rtol)


# Deep Gradient Compression's sparsity warm-up at ratio 0.05, 3 warm-up steps in 2 stages (Lin et al. Section 3.3,
# with the official code's coefficient ratio ** (1 / (stages + 1))), and its local clipping threshold (Section 3.2):
# 80 scaled by n ** -0.5. As the worker's "dgc" mode.
DGC_RATIOS = [1.0, 0.05 ** (1 / 3), 0.05 ** (1 / 3), 0.05 ** (2 / 3), 0.05]  # after dense_steps=1
DGC_CLIP = 80.0


def _check_dgc(ranks: list[dict], n: int) -> None:
    """Momentum correction (no masking), local clipping and sparsity warm-up against the reference fed the
    clipped inputs and the warm-up's ratios written out above (the clipping scale's norm is float32 in torch,
    float64 here: a relative tolerance of 2**-18); a state resumed from a checkpoint mid-warm-up continues bit for
    bit."""
    for numel, sizes in ((1000, None), (sum(SEGMENTS), SEGMENTS)):
        errors = [np.zeros(numel, np.float32) for _ in range(n)]
        velocities = [np.zeros(numel, np.float32) for _ in range(n)]
        clipped_any = unclipped_any = False
        for step, ratio in enumerate(DGC_RATIOS):
            xs = []
            for r in range(n):
                x = (rank_input(r, numel, torch.float32, seed=200 + step) * (step + 1)).numpy()
                scale = min(1.0, DGC_CLIP / np.sqrt(n) / np.linalg.norm(x.astype(np.float64)))
                clipped_any, unclipped_any = clipped_any or scale < 1.0, unclipped_any or scale == 1.0
                xs.append((x * np.float32(scale)).astype(np.float32))
            result, errors, velocities = ref.topk_momentum_allreduce(xs, errors, velocities, "Average", ratio, 0.9,
                                                                     "float32", sizes, False)
            for r in range(n):
                y, err, velocity = ranks[r]["dgc"][numel]["calls"][step]
                what = f"DGC numel={numel} n={n} rank {r} call {step} (ratio {ratio:.4f})"
                _assert_equal(_np(y), result, what + " result", 2.0**-18)
                _assert_equal(_np(err), errors[r].astype(np.float64), what + " error", 2.0**-18)
                _assert_equal(_np(velocity), velocities[r].astype(np.float64), what + " velocity", 2.0**-18)
        assert clipped_any and unclipped_any, "the DGC case should clip some calls and not others"
        for r in range(n):
            got = ranks[r]["dgc"][numel]
            assert got["resumed_same"] == [True, True, True], f"DGC numel={numel} rank {r}: resumed calls differ"
            assert got["describe"]["warmup_steps"] == 3 and got["describe"]["clip_norm"] == DGC_CLIP
            assert got["describe"]["dense_steps"] == 1
        # The dense first call sent everything and left nothing behind; the warm-up's 0.05 ** (1/3) = 0.37 is sent
        # dense from 3 ranks on (n * k >= numel), and the last two calls leave some out everywhere.
        sent_dense = [ref.topk_sends_dense(numel, ratio, sizes or [numel], n) for ratio in DGC_RATIOS]
        assert sent_dense == [True, n >= 3, n >= 3, False, False], sent_dense
        assert not np.any(ranks[0]["dgc"][numel]["calls"][0][1].numpy()), "the dense call left an error behind"


def _check_bytes(stats: dict) -> None:
    """One call of 2**16 float32 at 4 ranks: fp16/bf16 send half of the dense bytes, top-k 1% and random-k 1% a
    small fraction (payload model: top-k k 8-byte pairs to each of 3 peers, random-k a ring allreduce of k
    floats), top-k at 1 / n what dense sends. Signature exchanges included."""
    dense = stats["none"]["bytes_sent"]
    ratio = {k: v["bytes_sent"] / dense for k, v in stats.items()}
    print("bytes sent per call vs dense at n=4, 2**16 float32:", {k: round(v, 4) for k, v in ratio.items()})
    assert ratio["fp16"] <= 0.55 and ratio["bf16"] <= 0.55, ratio
    assert ratio["topk"] <= 0.05, ratio  # (n - 1) * k * 8 bytes: 0.04 at n = 4
    assert ratio["randomk"] <= 0.02, ratio
    # Below 1 / n the pairs cost (n - 1) k 8 bytes (0.8 of dense at 0.2); from 1 / n on top-k sends dense, for
    # what the dense reduction costs, not the 1.0 of dense its pairs would (or 4.5 at a density of 1).
    assert 0.75 <= ratio["topk_0.2"] <= 0.85, ratio
    assert 0.99 <= ratio["topk_0.25"] <= 1.01, ratio


@pytest.mark.parametrize("n", RESUME)
def test_stopped_and_resumed_run_is_bit_identical(n: int, launched) -> None:
    ranks = launched.ranks(n, ((), {}, "compression_resume.py"))
    for name in ("topk", "randomk", "topk_dgc"):
        for r, rk in enumerate(ranks):
            (p1, s1), (p2, s2) = rk[name]["straight"], rk[name]["resumed"]
            assert torch.equal(p1, p2), f"{name} n={n} rank {r}: resumed parameters differ by {(p1 - p2).abs().max()}"
            for i, (a, b) in enumerate(zip(s1["buffers"], s2["buffers"], strict=True)):
                assert a["step"] == b["step"] == 6, f"{name} rank {r} buffer {i}: steps {a['step']}, {b['step']}"
                assert torch.equal(a["error"], b["error"]), f"{name} n={n} rank {r}: resumed error feedback differs"
                assert ("velocity" in a) == ("velocity" in b) == (name == "topk_dgc"), f"{name} rank {r}: velocity"
                if "velocity" in a:
                    assert torch.equal(a["velocity"], b["velocity"]), f"{name} n={n} rank {r}: resumed velocity differs"
            saved = rk[name]["saved"]["buffers"][0]
            assert saved["step"] == 3 and saved["error"].abs().sum() > 0, f"{name} rank {r}: checkpoint lacks the error"
            if name == "topk_dgc":
                assert saved["velocity"].abs().sum() > 0, f"{name} rank {r}: checkpoint lacks the velocity"
        p0 = ranks[0][name]["straight"][0]
        for r in range(1, n):
            assert torch.equal(ranks[r][name]["straight"][0], p0), f"{name} n={n}: rank {r}'s parameters differ"


def test_bad_input_raises_on_every_rank_and_leaves_state_untouched(launched) -> None:
    n = 3
    ranks = launched.ranks(n, BAD)
    for r, rk in enumerate(ranks):
        where = f"rank {r} of {n}"
        assert rk["adasum"].startswith(USAGE) and "Average or Sum" in rk["adasum"], f"{where}: {rk['adasum']}"
        assert rk["adasum_step"] == 0, where
        for case in ("seed", "ratio", "kind", "fp16_vs_none", "momentum", "masking"):
            assert rk[case].startswith("MismatchError"), f"{where} {case}: {rk[case]}"
        for bad in ("nan", "inf"):
            for cname in ("topk", "randomk", "fp16", "topk_dgc", "topk_dgc_clip"):
                got = rk[f"{bad}.{cname}"]
                ok = got.startswith(USAGE) and f"rank {n - 1} rejected" in got and bad in got
                assert ok, f"{where}: {got}"
                assert rk[f"{bad}.{cname}.untouched"], f"{where} {bad} {cname}: tensor or state changed"
        assert rk["state_size"].startswith(USAGE) and "rank 1 rejected" in rk["state_size"], where
        assert "301" in rk["state_size"] and "300" in rk["state_size"], f"{where}: {rk['state_size']}"
        for case in ("optimizer_adasum", "optimizer_onebit"):
            assert rk[case].startswith("ValueError") and "Average or Sum" in rk[case], f"{where}: {rk[case]}"
        got = rk["optimizer_dgc_twice"]
        assert got.startswith("ValueError") and "twice" in got and "momentum=0" in got, f"{where}: {got}"
        # top-k of ones(10) at 0.1 sends k = 1 element (index 0) from every rank: the average is [1, 0, ...].
        assert rk["after"] == 1.0, f"{where}: the call after the errors gave {rk['after']}"


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan"), "0.1", True])
def test_ratio_outside_zero_one_is_refused(ratio) -> None:
    from hvd_compress.ops.compression import Compression

    with pytest.raises(ValueError, match=r"ratio must be a number in \(0, 1\]"):
        Compression.topk(ratio)
    with pytest.raises(ValueError, match=r"ratio must be a number in \(0, 1\]"):
        Compression.randomk(ratio, seed=1)


def test_horovod_compressors_map_to_ours() -> None:
    hvd = pytest.importorskip("horovod.torch")
    from hvd_compress.ops.compression import Compression, resolve

    assert resolve(hvd.Compression.fp16) is Compression.fp16
    assert resolve(hvd.Compression.none) is Compression.none
    assert resolve(None) is Compression.none
    with pytest.raises(TypeError, match="not supported"):
        resolve("fp16")

    from horovod.torch.compression import Compressor

    class Custom(Compressor):  # a user's own Horovod compressor: refused, naming what is taken
        pass

    for custom in (Custom, Custom()):
        with pytest.raises(TypeError, match=r"use hc\.Compression\.none, fp16"):
            resolve(custom)


def test_selection_matches_reference_including_ties() -> None:
    """The core's top-k (ties to the lower index, -0.0 == 0.0) and random-k selections against the reference."""
    from hvd_compress import _core

    rng = np.random.default_rng(0)
    for numel in (1, 7, 100, 5000):
        c = rng.standard_normal(numel).astype(np.float32)
        c[::3] = np.round(c[::3])  # many ties
        c[::7] = -0.0
        for ratio in (0.001, 0.01, 0.3, 1.0):
            k = ref.sparse_k(numel, ratio)
            assert _core.sparse_k(numel, ratio) == k
            idx = np.zeros(k, np.uint32)
            _core.topk_select(c, idx)
            np.testing.assert_array_equal(idx, ref.topk_select(c, k), err_msg=f"topk numel={numel} ratio={ratio}")
            _core.randomk_select(numel, 2**40 + 3, 7, idx)
            np.testing.assert_array_equal(idx, ref.randomk_select(numel, k, 2**40 + 3, 7),
                                          err_msg=f"randomk numel={numel} ratio={ratio}")


@pytest.mark.parametrize("momentum", [-0.1, 1.0, 1.5, float("nan"), "0.9", True])
def test_topk_momentum_outside_zero_one_is_refused(momentum) -> None:
    from hvd_compress.ops.compression import Compression

    with pytest.raises(ValueError, match=r"momentum must be a number in \[0, 1\)"):
        Compression.topk(0.01, momentum=momentum)


def test_topk_without_momentum_is_plain_topk_and_its_checkpoint_format_is_unchanged() -> None:
    from hvd_compress.torch import Compression, CompressionState

    assert Compression.topk(0.01, momentum=0) == Compression.topk(0.01)
    assert Compression.topk(0.01, momentum=0, momentum_masking=False) == Compression.topk(0.01)
    assert Compression.topk(0.01).describe() == {"kind": "topk", "ratio": 0.01, "seed": 0}
    assert repr(Compression.topk(0.01, momentum=0.9)) == "Compression.topk(0.01, momentum=0.9)"
    state = CompressionState(10, Compression.topk(0.01))
    assert state.velocity is None and "velocity" not in state.state_dict()


def test_dgc_checkpoint_without_velocity_is_refused_and_state_untouched() -> None:
    from hvd_compress.torch import Compression, CompressionState

    dgc = Compression.topk(0.5, momentum=0.9)
    state = CompressionState(4, dgc)
    state.error += 1.0
    state.velocity += 2.0
    state.step = 5
    saved = state.state_dict()
    assert torch.equal(saved["velocity"], torch.full((4,), 2.0))
    fresh = CompressionState(4, dgc)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.velocity, state.velocity) and torch.equal(fresh.error, state.error) and fresh.step == 5
    no_velocity = {k: v for k, v in saved.items() if k != "velocity"}
    with pytest.raises(ValueError, match="velocity"):
        state.load_state_dict({**no_velocity, "error": torch.zeros(4), "step": 1})
    assert torch.equal(state.error, torch.ones(4)) and torch.equal(state.velocity, torch.full((4,), 2.0))
    assert state.step == 5
    plain = CompressionState(4, Compression.topk(0.5)).state_dict()  # a checkpoint of plain top-k
    with pytest.raises(ValueError, match="compression"):
        state.load_state_dict(plain)
    assert state.step == 5


def test_topk_momentum_masking_must_be_a_bool() -> None:
    from hvd_compress.ops.compression import Compression

    with pytest.raises(ValueError, match="momentum_masking must be True or False"):
        Compression.topk(0.01, momentum=0.9, momentum_masking=1)
    off = Compression.topk(0.01, momentum=0.9, momentum_masking=False)
    assert off.describe()["momentum_masking"] is False and "momentum_masking=False" in repr(off)


def test_momentum_given_to_the_wrapped_optimizer_after_construction_raises_at_step_on_every_rank(launched) -> None:
    """DGC momentum in the compression: a momentum set in a param group, or a group added with one, after
    DistributedOptimizer was built raises ValueError at step()/synchronize() (also step() inside skip_synchronize())
    on every rank before any collective (the added group: UsageError, as any group added after wrapping), parameters
    and compression state unchanged; undone, the same call takes the
    step with the same gradients, alike on every rank. Set on rank 1 only, rank 1 raises ValueError and the others
    RejectedInputError with its reason (no wait for rank 1's calls), nothing changed on any rank."""
    n = 3
    ranks = launched.ranks(n, LATE)
    for r, rk in enumerate(ranks):
        for case in ("group_step", "group_synchronize", "group_skip_synchronize", "added_group_step",
                     "one_rank_step", "one_rank_synchronize"):
            got = rk[case]
            if case.startswith("one_rank") and r != 1:  # the core's message names rank 1 and (cut) its reason
                assert got.startswith("RejectedInputError") and "rank 1 rejected" in got, f"rank {r} {case}: {got}"
                assert "ValueError: compression=" in got and "DGC momentum" in got, f"rank {r} {case}: {got}"
            elif case == "added_group_step":  # any group added after wrapping is refused (test_param_groups_change)
                assert got.startswith("UsageError") and "param groups changed" in got, f"rank {r} {case}: {got}"
            else:
                assert got.startswith("ValueError") and "twice" in got and "after" in got, f"rank {r} {case}: {got}"
                assert "param_groups[0]" in got, f"rank {r} {case}: {got}"
            assert rk[f"{case}.unchanged"], f"rank {r} of {n} {case}: parameters or compression state changed"
            for i, (a, b) in enumerate(zip(rk[f"{case}.retried"], ranks[0][f"{case}.retried"], strict=True)):
                assert torch.equal(a, b), f"rank {r} of {n} {case}: param {i} after the retried step != rank 0"


@pytest.mark.parametrize("options", [{"clip_norm": -1.0}, {"clip_norm": float("inf")}, {"clip_norm": float("nan")},
                                     {"clip_norm": True}, {"clip_norm": "5"}, {"warmup_steps": -1},
                                     {"warmup_steps": 2.0}, {"warmup_steps": True},
                                     {"warmup_steps": 10, "warmup_stages": 0}, {"dense_steps": -1},
                                     {"dense_steps": 1.5}, {"dense_steps": False}])
def test_topk_bad_dgc_options_are_refused(options) -> None:
    from hvd_compress.ops.compression import Compression

    key = next(iter(options)) if len(options) == 1 else "warmup_stages"
    with pytest.raises(ValueError, match=f"topk {key} must be"):
        Compression.topk(0.01, momentum=0.9, **options)


def test_dgc_warmup_follows_the_papers_ramp_and_clipping_its_scaled_threshold() -> None:
    """Lin et al. Section 3.3: density 25%, 6.25%, 1.5625%, 0.39% over four warm-up epochs, then 0.1% (the
    official code's coefficient 0.001 ** (1/5) = 0.2512 gives them to within 0.5%); Section 3.2: each of N ranks
    clips at the threshold times N ** -0.5. Defaults leave top-k and its checkpoint format as they were."""
    from hvd_compress.ops import dgc
    from hvd_compress.ops.compression import Compression

    got = [dgc.warmup_ratio(0.001, 400, 4, step) for step in (0, 99, 100, 200, 300, 399, 400, 10**6)]
    want = [0.25, 0.25, 0.0625, 0.015625, 0.00390625, 0.00390625, 0.001, 0.001]
    np.testing.assert_allclose(got, want, rtol=0.02)
    assert [dgc.warmup_ratio(0.01, 0, 4, s) for s in (0, 5)] == [0.01, 0.01]
    assert dgc.local_clip_scale(10.0, 10.0, 4) == 0.5 and dgc.local_clip_scale(4.0, 10.0, 4) == 1.0
    assert dgc.local_clip_scale(float("nan"), 10.0, 4) == 1.0
    plain = Compression.topk(0.01, momentum=0.9)
    assert "clip_norm" not in plain.describe() and "warmup_steps" not in plain.describe()
    full = Compression.topk(0.01, momentum=0.9, momentum_masking=False, clip_norm=5.0, warmup_steps=300)
    assert full.describe()["warmup_stages"] == 4 and full != plain
    assert repr(full) == ("Compression.topk(0.01, momentum=0.9, momentum_masking=False, clip_norm=5.0, "
                          "warmup_steps=300, warmup_stages=4)")


def test_dense_steps_come_before_the_warm_up_and_survive_a_keras_config() -> None:
    """``dense_steps`` calls at density 1 (torch's ``start_powerSGD_iter`` for top-k), then the warm-up counted
    from there; the Keras config carries it, and a compressor without it describes itself as before."""
    from hvd_compress.keras.wrapped_step import compression_config, compression_from_config
    from hvd_compress.ops import dgc
    from hvd_compress.ops.compression import Compression

    got = [dgc.warmup_ratio(0.001, 400, 4, step, dense_steps=50) for step in (0, 49, 50, 149, 150, 449, 450)]
    np.testing.assert_allclose(got, [1.0, 1.0, 0.25, 0.25, 0.0625, 0.00390625, 0.001], rtol=0.02)
    assert [dgc.warmup_ratio(0.01, 0, 4, s, dense_steps=2) for s in (0, 1, 2)] == [1.0, 1.0, 0.01]
    comp = Compression.topk(0.01, momentum=0.9, warmup_steps=300, warmup_stages=300, dense_steps=150)
    assert comp.describe()["dense_steps"] == 150 and "dense_steps" not in Compression.topk(0.01).describe()
    assert repr(comp).endswith("warmup_steps=300, warmup_stages=300, dense_steps=150)")
    assert compression_from_config(compression_config(comp)) == comp
