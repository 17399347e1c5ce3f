"""Adasum (hc.allreduce(op=Adasum), grouped_allreduce, adasum_fused_) on real MPI processes.

Against the NumPy reference (hvd_compress/reference/adasum.py) element by element at n = 2..5,
against Horovod's own hvd.allreduce(op=hvd.Adasum) at n = 2 and 4, plus the Adasum identities,
hierarchical mode, errors raised on every rank, and bytes on the wire. One mpirun launch per n
serves every test of that n.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, load_ranks, mpirun
from workers.common import DTYPES, rank_input

from hvd_compress import reference
from hvd_compress.reference.adasum import combine_steps as _steps
from hvd_compress.reference.adasum import core_tolerance as _tolerance

SIZES = [0, 1, 7, 4097, 1 << 20]
GROUP = [5, 0, 4097, 1, 300]  # as in tests/workers/adasum.py
LOCAL_SIZE = 2  # HVDC_LOCAL_SIZE of the launches: nodes {0,1}, {2,3}, {4}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Callable[[int], list[dict[str, Any]]]:
    """What every rank saved in the one adasum.py launch at n ranks (launched on first use)."""
    cache: dict[int, list[dict[str, Any]]] = {}

    def get(n: int) -> list[dict[str, Any]]:
        if n not in cache:
            out = tmp_path_factory.mktemp(f"adasum{n}")
            env = {"HVDC_LOCAL_SIZE": str(LOCAL_SIZE)}
            mpirun("adasum.py", n, out, ",".join(map(str, SIZES)), env=env, timeout=300)
            cache[n] = load_ranks(out, n)
        return cache[n]

    return get


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy().ravel()


def _group_input(r: int, dtype: torch.dtype) -> np.ndarray:
    """Rank r's tensors of the grouped cases (seeds as in the worker), concatenated."""
    return np.concatenate([_np(rank_input(r, k, dtype, seed=100 + i)) for i, k in enumerate(GROUP)])


def _assert_matches(label: str, got: list[np.ndarray], want: list[np.ndarray], tol: np.ndarray, n: int) -> None:
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"{label} n={n}: rank {r} shape {g.shape}, want {w.shape}"
        nan_ok = np.isnan(g) == np.isnan(w)
        assert nan_ok.all(), f"{label} n={n}: rank {r} NaN at {np.flatnonzero(~nan_ok)[:5]} differs"
        err = np.where(np.isnan(w), 0.0, np.abs(g - w))
        bad = np.flatnonzero(err > tol)
        assert bad.size == 0, (
            f"{label} n={n}: rank {r} differs from the reference at {bad.size} element(s) of {g.size}, first at "
            f"{bad[0]}: got {g[bad[0]]!r}, want {w[bad[0]]!r}, tolerance {tol[bad[0]]:.3g} (max error {err.max():.3g})"
        )
        # Every rank holds the same bits: the allgather hands the same stored values to everyone.
        assert np.array_equal(g, got[0], equal_nan=True), f"{label} n={n}: rank {r} differs from rank 0"


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long), pytest.param(5, marks=pytest.mark.long)])
def test_adasum_matches_reference_for_every_dtype_and_size(n: int, ranks) -> None:
    saved = ranks(n)
    for dname, dtype in DTYPES.items():
        for numel in SIZES:
            inputs = [_np(rank_input(r, numel, dtype, seed=numel)) for r in range(n)]
            want = reference.adasum(inputs, dtype=dname)
            got = [_np(rk["single"][(dname, numel)]) for rk in saved]
            _assert_matches(
                f"allreduce(Adasum) {dname} numel={numel}", got, want, _tolerance(inputs, dname, _steps(n)), n
            )


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long), pytest.param(5, marks=pytest.mark.long)])
def test_grouped_adasum_has_per_tensor_coefficients_and_matches_reference(n: int, ranks) -> None:
    saved = ranks(n)
    for dname, dtype in DTYPES.items():
        inputs = [_group_input(r, dtype) for r in range(n)]
        want = reference.adasum(inputs, sizes=GROUP, dtype=dname)
        got = [np.concatenate([_np(t) for t in rk["grouped"][dname]]) for rk in saved]
        _assert_matches(f"grouped {dname} sizes={GROUP}", got, want, _tolerance(inputs, dname, _steps(n)), n)
        # One tensor's coefficient differs from the whole buffer's: the per-tensor split matters.
        whole = reference.adasum(inputs, dtype=dname)[0]
        assert not np.allclose(whole, want[0]), f"grouped {dname} n={n}: per-tensor and whole-buffer results agree"
        for r, rk in enumerate(saved):
            fused = _np(rk["fused"][dname])
            assert np.array_equal(fused, got[r]), f"adasum_fused_ {dname} n={n}: rank {r} differs from grouped"


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long), pytest.param(5, marks=pytest.mark.long)])
def test_hierarchical_adasum_averages_nodes_then_matches_reference(n: int, ranks) -> None:
    saved = ranks(n)
    nodes = -(-n // LOCAL_SIZE)
    steps = _steps(nodes) + 1  # the node average is one more rounding
    for dname, dtype in DTYPES.items():
        inputs = [_group_input(r, dtype) for r in range(n)]
        want = reference.adasum_hierarchical(inputs, LOCAL_SIZE, sizes=GROUP, dtype=dname)
        for which, label in ((0, "hierarchical=True"), (1, "HVDC_ADASUM_HIERARCHICAL=1")):
            got = [_np(rk["hier"][dname][which]) for rk in saved]
            _assert_matches(f"{label} {dname} local_size={LOCAL_SIZE}", got, want, _tolerance(inputs, dname, steps), n)


@pytest.mark.parametrize("n", [2, 3, pytest.param(5, marks=pytest.mark.long)])
def test_adasum_identities_orthogonal_identical_zero_and_nan(n: int, ranks) -> None:
    saved = ranks(n)
    for dname in ("float32", "float64"):
        names = ["orthogonal", "identical", "zero", "half_zero", "nan", "after_nan"]
        inputs = [[_np(t) for t in rk["special"][dname][0]] for rk in saved]
        outs = [[_np(t) for t in rk["special"][dname][1]] for rk in saved]
        for r in range(n):
            o = dict(zip(names, outs[r], strict=True))
            i0 = dict(zip(names, inputs[0], strict=True))
            ortho_sum = np.sum([inp[0] for inp in inputs], axis=0)
            assert np.array_equal(o["orthogonal"], ortho_sum), (
                f"{dname} n={n}: rank {r}: orthogonal inputs, not their sum"
            )
            assert np.array_equal(o["identical"], i0["identical"]), f"{dname} n={n}: rank {r}: Adasum(g, .., g) != g"
            assert np.array_equal(o["zero"], np.zeros(9)), f"{dname} n={n}: rank {r}: zero vectors gave {o['zero']}"
            assert np.isnan(o["nan"]).all(), f"{dname} n={n}: rank {r}: NaN did not propagate: {o['nan']}"
            assert np.isfinite(o["after_nan"]).all(), f"{dname} n={n}: rank {r}: NaN leaked into the next tensor"
        sizes = [len(x) for x in inputs[0]]
        flat_in = [np.concatenate(x) for x in inputs]
        want = reference.adasum(flat_in, sizes=sizes, dtype=dname)
        _assert_matches(
            f"special {dname}", [np.concatenate(o) for o in outs], want, _tolerance(flat_in, dname, _steps(n)), n
        )


@pytest.mark.parametrize("n", [2, 3])
def test_adasum_in_place_on_noncontiguous_tensor(n: int, ranks) -> None:
    saved = ranks(n)
    inputs = [rank_input(r, 64, torch.float32, seed=12).view(8, 8).t().contiguous().numpy().ravel() for r in range(n)]
    want = reference.adasum(inputs, dtype="float32")
    got = [_np(rk["noncontig"]) for rk in saved]
    _assert_matches("noncontiguous", got, want, _tolerance(inputs, "float32", _steps(n)), n)


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_adasum_mismatched_or_bad_arguments_raise_on_every_rank(n: int, ranks) -> None:
    saved = ranks(n)
    expect = {
        "numel": ("MismatchError", "numel: rank 0=4; rank 1=5;"),
        "count": ("MismatchError", "tensor count:"),
        "layout": ("MismatchError", "tensor sizes (hash):"),
        "mode": ("MismatchError", "op:"),
        "bad_sizes": (USAGE, f"rank {n - 1} rejected its input: Adasum: tensor sizes"),
        "mixed_dtypes": (USAGE, "share one dtype"),
        "int_dtype": (USAGE, "rank 0 rejected its input"),
    }
    for r, rk in enumerate(saved):
        for label, (kind, text) in expect.items():
            got = rk["caught"][label]
            assert got.startswith(kind) and text in got, (
                f"{label} n={n}: rank {r} got {got!r}, want {kind} with {text!r}"
            )
        inputs = [np.full(3, float(q + 1)) for q in range(n)]
        want = reference.adasum(inputs, dtype="float32")[r]
        np.testing.assert_allclose(_np(rk["recovered"]), want, rtol=1e-6, err_msg=f"rank {r}: Adasum after the errors")


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_adasum_comm_stats_count_halving_and_allgather_bytes(n: int, ranks) -> None:
    saved = ranks(n)
    p = 1 << (n.bit_length() - 1)
    nbytes = 4096 * 4
    for r, rk in enumerate(saved):
        s = rk["stats"]
        assert s["calls"] == 1, f"rank {r}: {s}"
        if r >= p:  # folded in: the whole vector out, the result back
            data = nbytes
        else:  # halving then allgather: (1/2 + ... + 1/p) of the vector each way, plus the fold
            data = 2 * (nbytes - nbytes // p) + (nbytes if r + p < n else 0)
        overhead = s["bytes_sent"] - data
        # The signature exchange (<= 256 bytes per peer) and 3 doubles per level allreduce (ring model).
        assert 0 <= overhead <= 256 * (n - 1) + 64 * _steps(n), f"rank {r} of {n}: data {data}, {s}"


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.long)])
def test_adasum_matches_horovod_at_power_of_two(n: int, out_dir) -> None:
    mpirun("adasum_horovod.py", n, out_dir, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        for key, (ours, theirs) in rk.items():
            # Horovod forms float32 products in float32 before summing them in double, the core in
            # double: the coefficients differ by ~1e-7 relative at most, hence 1e-6 (1e-12 in float64).
            rel = 1e-6 if "float32" in key[0] else 1e-12
            err = (ours.double() - theirs.double()).abs().max().item()
            scale = max(theirs.double().abs().max().item(), 1e-30)
            assert err <= rel * scale, (
                f"rank {r} of {n} {key}: hc vs hvd Adasum max error {err:.3g} (scale {scale:.3g})"
            )


WAIT_SIZES = [8, 9, 15, 16, 17, 63, 65, (1 << 22) + 3]  # as passed to tests/workers/adasum_wait.py


@pytest.mark.parametrize("n", [2, 3])
def test_adasum_is_exact_and_deterministic_when_ranks_arrive_late(n: int, out_dir) -> None:
    mpirun("adasum_wait.py", n, out_dir, ",".join(map(str, WAIT_SIZES)), timeout=240)
    saved = load_ranks(out_dir, n)
    for dname in ("float32", "float64"):
        for numel in WAIT_SIZES:
            inputs = [_np(rank_input(r, numel, DTYPES[dname], seed=numel + 1)) for r in range(n)]
            want = reference.adasum(inputs, dtype=dname)
            late = [_np(rk[(dname, numel)][0]) for rk in saved]
            _assert_matches(
                f"late ranks {dname} numel={numel}", late, want, _tolerance(inputs, dname, _steps(n)), n
            )
            for r, rk in enumerate(saved):
                again = _np(rk[(dname, numel)][1])
                assert np.array_equal(again, late[r], equal_nan=True), (
                    f"{dname} numel={numel}: rank {r} of {n}: the same input reduced twice gave different bits"
                )
