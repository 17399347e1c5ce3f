"""hc.allreduce / allreduce_ with Sum and Average on real MPI processes, against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import Cases

from hvd_compress import reference

# (1 << 18) + 5: from 64 KiB per rank a float sum runs as the core's ring (cpp/src/mpi_communicator.cc), here
# with chunks of unequal length at 3 and 4 ranks.
SIZES = [0, 1, 7, 4097, (1 << 18) + 5]
ALL, NONCONTIG, STATS = (",".join(map(str, SIZES)),), ("1",), ("4097",)
# The cases at one rank count in one launch (each case's comm_stats() resets the counts it saves).
CASES = {1: [ALL], 2: [ALL, NONCONTIG, STATS], 3: [ALL, NONCONTIG, STATS], 4: [ALL, STATS]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("allreduce.py", CASES, tmp_path_factory.mktemp("allreduce"))


def _tolerance(expected: np.ndarray, inputs: list[np.ndarray], dtype: str, n: int) -> np.ndarray:
    # The core sums in float32 (half types widened first; float64 as is) in MPI's order; the reference
    # is exact and rounds once. Allow the summation error (n roundings of at most sum|x_i|) plus one
    # ulp of the storage dtype.
    eps = 2.0**-52 if dtype == "float64" else 2.0**-23
    abs_sum = np.sum([np.abs(x) for x in inputs], axis=0)
    return reference.ulp(expected, dtype) + eps * n * abs_sum


@pytest.mark.parametrize("n", [1, 2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_allreduce_matches_reference_for_every_dtype_and_size(n: int, launched) -> None:
    ranks = launched.ranks(n, ALL)
    keys = [k for k in ranks[0]["results"] if isinstance(k, tuple)]
    assert len(keys) == 2 * 4 * len(SIZES)
    for key in keys:
        op, dtype, numel = key
        inputs = [rk["results"][key][0].numpy() for rk in ranks]
        expected = reference.allreduce(inputs, op=op, dtype=dtype)
        for r, rk in enumerate(ranks):
            _, out, out_inplace = rk["results"][key]
            if op == "Sum":  # every rank holds the same bits, whatever order the sum took
                assert out.numpy().tobytes() == ranks[0]["results"][key][1].numpy().tobytes(), (
                    f"{op} {dtype} numel={numel} n={n}: rank {r}'s result differs from rank 0's")
            for label, got in (("allreduce", out.numpy()), ("allreduce_", out_inplace.numpy())):
                assert got.shape == expected[r].shape
                err = np.abs(got - expected[r])
                tol = _tolerance(expected[r], inputs, dtype, n)
                bad = np.flatnonzero(err > tol)
                assert bad.size == 0, (
                    f"{label} {op} {dtype} numel={numel} n={n}: rank {r} differs from the reference at "
                    f"{bad.size} element(s), first at {bad[0]}: got {got[bad[0]]}, want {expected[r][bad[0]]} "
                    f"(max error {err.max():.3g})"
                )


@pytest.mark.parametrize("n", [2, 3])
def test_allreduce_in_place_on_noncontiguous_tensor_keeps_layout(n: int, launched) -> None:
    ranks = launched.ranks(n, NONCONTIG)
    inputs = [rk["results"]["noncontig"][0].numpy().T for rk in ranks]
    want = np.sum(inputs, axis=0)
    for r, rk in enumerate(ranks):
        got = rk["results"]["noncontig"][1].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"rank {r} of {n}")


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_comm_stats_count_ring_bytes_of_each_call(n: int, launched) -> None:
    ranks = launched.ranks(n, STATS)
    for r, rk in enumerate(ranks):
        stats = rk["stats"]
        # 2 ops x 4 dtypes x (allreduce + allreduce_) of 4097 elements; halves travel as float32.
        elem_bytes = {"float16": 4, "bfloat16": 4, "float32": 4, "float64": 8}
        data = sum(2 * 2 * int(2 * (n - 1) / n * 4097 * b) for b in elem_bytes.values())
        data += int(2 * (n - 1) / n * 64 * 4)  # the non-contiguous float32 call
        assert stats["bytes_sent"] >= data, f"rank {r}: sent {stats['bytes_sent']} < data bytes {data}"
        assert stats["bytes_sent"] == stats["bytes_received"], f"rank {r}: {stats}"
        # Signature exchanges are small: at most 256 bytes per peer per call.
        assert stats["bytes_sent"] - data <= stats["calls"] * 256 * (n - 1), f"rank {r}: {stats}"
        assert stats["calls"] == 17, f"rank {r}: {stats}"
