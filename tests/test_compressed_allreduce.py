"""hc.compressed_allreduce (error-compensated 1-bit average, paper 003 Alg. 1 lines 7-13) on real MPI
processes against hvd_compress.reference.onebit, plus reference-only properties of the compressor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, Cases, load_ranks, mpirun
from workers.common import DTYPES, rank_input

from hvd_compress.reference import onebit as ref
from hvd_compress.reference.dtypes import round_to

SIZES = [1, 13, 1000, 4099, 2400, 1 << 18]  # 2400 is a multiple of 8 * n for n = 2, 3, 4
HALF_SIZES = [13, 4099, 2400]
STEPS = 3
FLOAT32 = (",".join(map(str, SIZES)), "float32", str(STEPS))
HALF = (",".join(map(str, HALF_SIZES)), "float16,bfloat16", str(STEPS))
BAD = ((), {}, "compressed_bad.py")
# The cases of the default configuration at one rank count in one launch, the bad input last.
CASES = {2: [FLOAT32, HALF, BAD], 3: [FLOAT32, HALF, BAD], 4: [FLOAT32]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("compressed.py", CASES, tmp_path_factory.mktemp("compressed"), timeout_per_case=90)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def _assert_close(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 2.0**-22) -> None:
    """Element-wise, within a couple of float32 ulps of the largest value (the float64 sum of squares
    is ordered differently from the C++, which may move a float32 scale by one ulp in rare ties)."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tol = rtol * max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    err = np.abs(got - want)
    bad = np.flatnonzero(err > tol)
    assert bad.size == 0, (
        f"{what}: {bad.size} element(s) differ from the reference, first at {bad[0]}: got {got[bad[0]]}, "
        f"want {want[bad[0]]} (max error {err.max():.3g}, tolerance {tol:.3g})"
    )


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_compressed_allreduce_matches_reference_at_every_call(n: int, launched) -> None:
    ranks = launched.ranks(n, FLOAT32)
    _compare(ranks, n, "float32", SIZES)
    _check_error_feedback(ranks, n)
    _check_bytes(ranks, n)


@pytest.mark.parametrize("n", [2, 3])
def test_compressed_allreduce_half_buffers_match_reference(n: int, launched) -> None:
    ranks = launched.ranks(n, HALF)
    _compare(ranks, n, "float16", HALF_SIZES)
    _compare(ranks, n, "bfloat16", HALF_SIZES)


def test_compressed_allreduce_on_portable_kernels_matches_reference(out_dir) -> None:
    """HVDC_ONEBIT_KERNELS=scalar runs the whole collective on the portable (non-SIMD) kernels."""
    n, sizes = 2, [13, 4099, 2400, 1 << 16]
    args = (",".join(map(str, sizes)), "float32,float16,bfloat16", str(STEPS))
    mpirun("compressed.py", n, out_dir, *args, env={"HVDC_ONEBIT_KERNELS": "scalar"}, timeout=240)
    ranks = load_ranks(out_dir, n)
    assert [rk["isa"] for rk in ranks] == ["scalar"] * n
    for dtype in ("float32", "float16", "bfloat16"):
        _compare(ranks, n, dtype, sizes)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_simd_and_portable_kernels_write_identical_bytes(dtype: str) -> None:
    """Every 1-bit kernel, AVX2 against portable (a no-op on a CPU without AVX2): bits, errors, results,
    sums, the non-finite scan; lengths around the 32-element blocks and tails, 1 to 5 server ranks."""
    from hvd_compress import _kernel_bench

    for numel in (0, 1, 7, 8, 31, 32, 33, 63, 64, 100, 1000, 4099, (1 << 16) + 5):
        for seed in range(3):
            why = _kernel_bench.onebit_kernels_self_check(numel, dtype, seed)
            assert why == "", f"{dtype} numel={numel} seed={seed}: {why}"


def _compare(ranks: list[dict], n: int, dtype: str, sizes: list[int]) -> None:
    for numel in sizes:
        werr = [np.zeros(numel) for _ in range(n)]
        serr = [np.zeros(ref.padded_numel(numel, n) // n) for _ in range(n)]
        for step in range(STEPS):
            inputs = [_np(rank_input(r, numel, DTYPES[dtype], seed=100 * step + 1)) for r in range(n)]
            outs, werr, serr = ref.compressed_allreduce(inputs, werr, serr, dtype)
            first = ranks[0]["results"][(dtype, numel)][step][0]
            for r, rk in enumerate(ranks):
                y, w, s = rk["results"][(dtype, numel)][step]
                where = f"{dtype} numel={numel} n={n} call {step}: rank {r}"
                assert torch.equal(y, first), f"{where}: result differs from rank 0's"
                _assert_close(_np(y), outs[r], f"{where} result")
                _assert_close(_np(w), werr[r], f"{where} worker error")
                _assert_close(_np(s), serr[r], f"{where} server error")
                pad = ref.chunk_bounds(numel, n)[r]
                assert not s[pad[1] - pad[0] :].any(), f"{where}: server error of the padding is not zero"


def _check_error_feedback(ranks: list[dict], n: int) -> None:
    """Error feedback (003 eq. 5): sum of results = sum of true averages - mean worker error - server
    error, so the running sum tracks the true one with an error that does not grow with the steps."""
    conv = [rk["converge"] for rk in ranks]
    steps = len(conv[0])
    true_sum = sum(np.mean([_np(conv[r][t][0]) for r in range(n)], axis=0) for t in range(steps))
    got_sum = sum(_np(conv[0][t][1]) for t in range(steps))
    mean_werr = np.mean([_np(rk["final_errors"][0]) for rk in ranks], axis=0)
    numel = mean_werr.size
    serr = np.zeros(numel)
    for j, (lo, hi) in enumerate(ref.chunk_bounds(numel, n)):
        serr[lo:hi] = _np(ranks[j]["final_errors"][1])[: hi - lo]
    # The identity holds up to float32 rounding of the per-step arithmetic.
    _assert_close(got_sum + mean_werr + serr, true_sum, f"n={n}: error-feedback identity", rtol=1e-4)
    rel = np.linalg.norm(got_sum - true_sum) / np.linalg.norm(true_sum)
    one = np.linalg.norm(_np(conv[0][0][1]) - np.mean([_np(c[0][0]) for c in conv], axis=0))
    one /= np.linalg.norm(np.mean([_np(c[0][0]) for c in conv], axis=0))
    assert rel < 0.1 and rel < one / 4, f"n={n}: running-sum error {rel:.3g} after {steps} steps (one step: {one:.3g})"


def _check_bytes(ranks: list[dict], n: int) -> None:
    numel = 1 << 20
    dense = 2 * (n - 1) / n * numel * 4  # a ring allreduce of float32, as the core counts it
    for r, rk in enumerate(ranks):
        sent = rk["stats"]["bytes_sent"]
        assert sent <= dense / 30, f"rank {r} of {n}: {sent} bytes sent, dense float32 ring {dense:.0f}"
        assert rk["stats"]["calls"] == 1, rk["stats"]


@pytest.mark.parametrize("n", [2, 3])
def test_bad_input_raises_on_every_rank_with_state_unchanged(n: int, launched) -> None:
    ranks = launched.ranks(n, BAD)
    expect = {
        "nan": (USAGE, [f"rank {n - 1} rejected", "element 5 is nan"]),
        "inf_half": (USAGE, ["rank 0 rejected", "element 999 is -inf"]),
        "worker_size": (USAGE, ["rank 1 rejected", "worker error has 999 elements, expected 1000"]),
        "server_dtype": (USAGE, ["rank 0 rejected", "server error must be float32, got float16"]),
        "float64": (USAGE, ["float64 is not supported"]),
        "numel_mismatch": ("MismatchError", ["numel"]),
        "overflow": (USAGE, ["= inf"]),
    }
    mean = (n + 1) / 2
    for r, rk in enumerate(ranks):
        for label, (kind, parts) in expect.items():
            msg = rk["caught"][label]
            assert msg.startswith(kind), f"rank {r} of {n}, {label}: {msg}"
            for p in parts:
                assert p in msg, f"rank {r} of {n}, {label}: {p!r} not in {msg!r}"
            assert rk["unchanged"][label], f"rank {r} of {n}, {label}: error buffers changed"
        assert rk["caught"]["recovered"] == str([mean] * 3), f"rank {r}: {rk['caught']['recovered']}"


# Reference-only properties (no MPI).


def test_reference_sign_of_zero_is_plus_one_and_bit_order_is_little_endian() -> None:
    signs, scale, err = ref.compress(np.array([0.0, -0.0, -2.0, 2.0]), np.zeros(4))
    assert signs.tolist() == [True, True, False, True]
    assert scale == pytest.approx(np.sqrt(2.0))
    np.testing.assert_allclose(err, ref.f32(np.array([0, 0, -2, 2]) - np.where(signs, scale, -scale)))
    assert ref.pack_signs(np.array([True, False, False, True, True]), 16).tolist() == [0b11001, 0]


def test_reference_padding_never_leaks_into_results_or_errors() -> None:
    n, numel = 4, 13
    inputs = [np.arange(numel, dtype=np.float64) - r for r in range(n)]
    werr = [np.zeros(numel) for _ in range(n)]
    serr = [np.zeros(ref.padded_numel(numel, n) // n) for _ in range(n)]
    outs, werr, serr = ref.compressed_allreduce(inputs, werr, serr)
    assert outs[0].shape == (numel,)
    # 13 elements, chunks of 8: rank 0 serves 8 real elements, rank 1 five, ranks 2 and 3 none.
    assert [hi - lo for lo, hi in ref.chunk_bounds(numel, n)] == [8, 5, 0, 0]
    assert not serr[1][5:].any() and not serr[2].any() and not serr[3].any()


def test_reference_of_equal_inputs_is_exact() -> None:
    x = round_to(np.full(37, 0.75), "bfloat16")
    serr0 = [np.zeros(ref.padded_numel(37, 3) // 3)] * 3
    outs, werr, serr = ref.compressed_allreduce([x, x, x], [np.zeros(37)] * 3, serr0)
    np.testing.assert_array_equal(outs[0], x)
    assert not any(e.any() for e in werr) and not any(e.any() for e in serr)


def test_reference_onebit_adam_warmup_is_adam_and_compression_tracks_dense_momentum() -> None:
    rng = np.random.default_rng(0)
    n, numel, steps = 3, 50, 12
    grads = [[rng.normal(size=numel) + 1.0 for _ in range(n)] for _ in range(steps)]
    x0 = rng.normal(size=numel)
    full = ref.onebit_adam(x0, grads, lr=0.01, freeze_step=steps)  # never compresses: plain Adam, dense mean
    m = v = np.zeros(numel)
    x = x0.copy()
    for t in range(steps):
        g = np.mean(grads[t], axis=0)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        x = x - 0.01 * m / (np.sqrt(v) + 1e-8)
        np.testing.assert_allclose(full.params[t], x, rtol=1e-12, err_msg=f"step {t + 1}")
    onebit = ref.onebit_adam(x0, grads, lr=0.01, freeze_step=4)
    np.testing.assert_array_equal(onebit.params[3], full.params[3])
    # Error feedback keeps the compressed run close to the same rule with a dense momentum average
    # ("1-bit Adam (32-bits)" of paper 003, Section 7): frozen v, uncompressed m.
    m, v = np.zeros(numel), np.zeros(numel)
    x = x0.copy()
    for t in range(steps):
        g = np.mean(grads[t], axis=0)
        m = 0.9 * m + 0.1 * g
        if t < 4:
            v = 0.999 * v + 0.001 * g * g
        x = x - 0.01 * m / (np.sqrt(v) + 1e-8)
    drift = np.linalg.norm(onebit.params[-1] - x) / np.linalg.norm(x - x0)
    assert drift < 0.25, f"1-bit Adam drifted {drift:.3g} from its uncompressed rule"
    assert np.array_equal(onebit.state["exp_avg_sq"], ref.onebit_adam(x0, grads[:4], freeze_step=4).state["exp_avg_sq"])


def test_reference_onebit_lamb_freezes_variance_and_clips_ratio() -> None:
    rng = np.random.default_rng(1)
    n, sizes, steps = 2, [30, 20], 10
    grads = [[rng.normal(size=sum(sizes)) for _ in range(n)] for _ in range(steps)]
    x0 = rng.normal(size=sum(sizes))
    trace = ref.onebit_lamb(x0, grads, sizes, lr=0.01, freeze_step=5)
    st = trace.state
    assert len(trace.params) == steps and all(np.isfinite(p).all() for p in trace.params)
    assert np.all((st["last_factor"] >= 0.5) & (st["last_factor"] <= 4.0))
    # r moved at most 10% per step from 1 over the 5 compression steps.
    assert np.all(np.abs(np.log(st["last_factor"])) <= 5 * np.log(1.1) + 1e-12)
    warm = ref.onebit_lamb(x0, grads[:5], sizes, lr=0.01, freeze_step=5).state
    np.testing.assert_array_equal(st["exp_avg_sq"], warm["exp_avg_sq"])
    np.testing.assert_array_equal(st["lamb_coeff_freeze"], warm["lamb_coeff_freeze"])


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_pipelined_compressed_allreduce_over_mpi_matches_reference(n: int, out_dir) -> None:
    """From 2^20 elements the core pipelines the call over non-blocking MPI sends and receives
    (HVDC_ONEBIT_PIPELINE: pieces of 4096 elements here, so that every chunk is cut in many); the result, worker and
    server error of every call must still equal the reference's."""
    sizes = [(1 << 20) + 37]
    mpirun("compressed.py", n, out_dir, ",".join(map(str, sizes)), "float32", str(STEPS),
           env={"HVDC_ONEBIT_PIPELINE": "4096"}, timeout=300)
    _compare(load_ranks(out_dir, n), n, "float32", sizes)
