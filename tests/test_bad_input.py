"""Bad input raises a clear exception on every rank, never a hang, and the ranks keep working after it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mpi_harness import ROOT, Cases, horovodrun, load_ranks, mpi_env, mpirun

# The cases that end with a working collective, at one rank count in one launch.
SLOW_PEER = (("slow_peer",), {"HVDC_STALL_WARNING": "1"})
CASES = {2: [("dtype",), ("shape",), ("shape_2d",), SLOW_PEER, ("optimizers_differ",)],
         3: [("dtype",), ("device",), ("shape",), ("shape_2d",), SLOW_PEER, ("optimizers_differ",)], 4: [("shape",)]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("bad_input.py", CASES, tmp_path_factory.mktemp("bad_input"), timeout_per_case=60)


def _caught(launched: Cases, n: int, case: str) -> list[dict[str, str]]:
    return [rk["caught"] for rk in launched.ranks(n, (case,))]


def _recovered(caught, n):
    want = str([float(sum(range(n)))] * 3)
    for r, c in enumerate(caught):
        assert c["recovered"] == want, f"rank {r} of {n}: collective after the error gave {c['recovered']}"


@pytest.mark.parametrize("n", [2, 3])
def test_unsupported_dtype_on_one_rank_raises_on_every_rank(n: int, launched) -> None:
    caught = _caught(launched, n, "dtype")
    for r, c in enumerate(caught):
        # RejectedInputError: a UsageError (ValueError) and a RuntimeError.
        assert c["dtype"].startswith("RejectedInputError"), f"rank {r}: {c['dtype']}"
        assert f"rank {n - 1} rejected its input" in c["dtype"] and "bool" in c["dtype"], f"rank {r}: {c['dtype']}"
        assert "float16, bfloat16, float32, float64" in c["dtype"], f"rank {r}: {c['dtype']}"
        assert c["complex_all"].startswith("RejectedInputError") and "complex64" in c["complex_all"], c["complex_all"]
    _recovered(caught, n)


def test_tensor_on_unsupported_device_raises_on_every_rank(launched) -> None:
    caught = _caught(launched, 3, "device")
    for r, c in enumerate(caught):
        assert c["device"].startswith("RejectedInputError") and "rank 1 rejected its input" in c["device"], f"{r}: {c}"
    _recovered(caught, 3)


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_mismatched_shape_dtype_op_raise_mismatch_on_every_rank(n: int, launched) -> None:
    caught = _caught(launched, n, "shape")
    for r, c in enumerate(caught):
        assert c["numel"].startswith("MismatchError"), f"rank {r}: {c['numel']}"
        assert "numel: rank 0=4; rank 1=5;" in c["numel"], f"rank {r}: {c['numel']}"
        assert c["dtype_mismatch"].startswith("MismatchError") and "float64" in c["dtype_mismatch"], c
        assert c["op_mismatch"].startswith("MismatchError") and "op:" in c["op_mismatch"], c
        assert c["unknown_op"].startswith("ValueError") and "unknown reduction op 42" in c["unknown_op"], c
    _recovered(caught, n)


@pytest.mark.parametrize("n", [2, 3])
def test_same_numel_in_different_shapes_raises_mismatch_naming_each_rank_shape(n: int, launched) -> None:
    caught = _caught(launched, n, "shape_2d")
    shapes = ["[2, 3]" if r % 2 == 0 else "[3, 2]" for r in range(n)]
    want = {
        "allreduce": "shape:" + "".join(f" rank {r}={s};" for r, s in enumerate(shapes)),
        "grouped": "shape:" + "".join(f" rank {r}=[4] {s};" for r, s in enumerate(shapes)),
    }
    for call in ("adasum", "broadcast", "compressed"):
        want[call] = want["allreduce"]
    for r, c in enumerate(caught):
        for call, text in want.items():
            assert c[call].startswith("MismatchError"), f"rank {r} of {n}, {call}: {c[call]}"
            assert text in c[call], f"rank {r} of {n}, {call}: {text!r} not in {c[call]!r}"
            assert "numel:" not in c[call], f"rank {r} of {n}, {call}: numel reported as different: {c[call]}"
    _recovered(caught, n)


@pytest.mark.parametrize("n", [2, 3])
def test_slow_peer_is_waited_for_with_warnings_naming_the_collective_and_the_rank(n: int, launched) -> None:
    caught = [rk["caught"] for rk in launched.ranks(n, SLOW_PEER)]
    want = str([float(n * (n + 1) // 2)] * 2)
    for r, c in enumerate(caught):
        assert c["slow_peer"] == want, f"rank {r} of {n}: {c['slow_peer']}, want {want}"
        warnings = [w for w in c["stderr"].splitlines() if "has waited" in w]
        if r == 0:  # the late rank waits for nobody
            assert not warnings, f"rank 0 of {n} warned: {warnings}"
            continue
        # At 1 s and 2 s of rank 0's 3 s (a loaded machine may let one pass), each naming the collective (its
        # name, kind, dtype and shape) and rank 0 alone: the other ranks joined at once.
        assert len(warnings) >= 1, f"rank {r} of {n}: no warning on stderr: {c['stderr']!r}"
        for w in warnings:
            assert w.startswith(f"hvd_compress: rank {r} has waited "), f"rank {r} of {n}: {w}"
            assert "in Eval.metric (allreduce of float32 [2]) for rank 0 to join it" in w, f"rank {r} of {n}: {w}"
            assert "HVDC_TIMEOUT=3600 s" in w and "HVDC_STALL_WARNING=1 s" in w, f"rank {r} of {n}: {w}"
    _recovered(caught, n)


@pytest.mark.parametrize("n", [2, 3])
def test_optimizers_that_differ_between_ranks_raise_naming_the_field_and_each_rank_value(n: int, launched) -> None:
    caught = _caught(launched, n, "optimizers_differ")
    ops = "".join(f" rank {r}={'OneBitAdam' if r == 0 else 'Average'};" for r in range(n))
    freeze = "".join(f" rank {r}={10 if r == 0 else 20};" for r in range(n))
    for r, c in enumerate(caught):
        for case in ("op", "freeze_step"):
            assert c[case].startswith("MismatchError"), f"rank {r} of {n}, {case}: {c[case]}"
            # The ranks' hyper-parameters are equal: nothing may blame them.
            assert "lr, momentum, betas, eps or weight decay" not in c[case], f"rank {r} of {n}: {c[case]}"
            assert "hyper-parameters" not in c[case] and "lr:" not in c[case], f"rank {r} of {n}: {c[case]}"
        assert f"\n  op:{ops}" in c["op"], f"rank {r} of {n}: {c['op']}"
        assert f"\n  freeze_step:{freeze}" in c["freeze_step"], f"rank {r} of {n}: {c['freeze_step']}"
        assert "\n  op:" not in c["freeze_step"], f"rank {r} of {n}: {c['freeze_step']}"
    _recovered(caught, n)


def test_peer_that_never_joins_gives_timeout_error_not_hang(out_dir) -> None:
    # Rank 0 leaves without MPI_Finalize (its request can never complete), so mpirun reports an
    # abnormal exit: the verdict comes from what rank 0 recorded.
    mpirun("bad_input.py", 2, out_dir, "timeout", timeout=60, check=False)
    c0 = load_ranks(out_dir, 1)[0]["caught"]
    assert c0["timeout"].startswith("CommTimeoutError") and "HVDC_TIMEOUT" in c0["timeout"], c0
    assert " s for rank 1 to join a collective" in c0["timeout"], c0  # the rank it waited for, by number
    assert 1.5 <= float(c0["waited"]) < 5.0, c0
    # The communicator is unusable after a timeout; later calls say so instead of hanging.
    assert c0["after_timeout"].startswith("CommTimeoutError") and "restarted" in c0["after_timeout"], c0


@pytest.mark.parametrize(("case", "transfer"), [("stall", "a ring allreduce"), ("stall-max", "an allreduce")])
def test_peer_that_stops_inside_a_collective_ends_the_job_not_hang(case: str, transfer: str, out_dir) -> None:
    # Rank 1 stops (SIGSTOP) inside a loop of large allreduces (Sum: the ring; Max: MPI_Iallreduce); rank 0 waits
    # in the data phase, which no exception can leave safely (its requests can be neither cancelled nor
    # abandoned), so after HVDC_TIMEOUT (3 s) the core aborts the job with a message. A stop that lands in a
    # signature exchange, or after rank 1 had sent all it owed to a call rank 0 could then finish alone, is the
    # agreement's timeout on rank 0 instead: then the run is repeated. (Rank 1, resumed by mpirun to be killed,
    # may then print its own stall message: only rank 0's counts.)
    for _attempt in range(3):
        start = time.monotonic()
        res = mpirun("bad_input.py", 2, out_dir, case, timeout=90, check=False)
        elapsed = time.monotonic() - start
        if "hvd_compress: rank 0 waited" in res.stdout:
            break
        c0 = load_ranks(out_dir, 1)[0]["caught"]
        assert c0[case].startswith("CommTimeoutError"), (c0, res.stdout[-3000:])
    assert res.returncode != 0, res.stdout[-3000:]
    assert "hvd_compress: rank 0 waited" in res.stdout and "HVDC_TIMEOUT" in res.stdout, res.stdout[-3000:]
    assert f"inside {transfer}" in res.stdout, res.stdout[-3000:]
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end"


def test_gil_is_released_while_the_core_waits(out_dir) -> None:
    mpirun("bad_input.py", 2, out_dir, "gil", timeout=60)
    c1 = load_ranks(out_dir, 2)[1]["caught"]
    assert int(c1["ticks"]) > 200, f"a Python thread ran only {c1['ticks']} ticks during a 1.5 s wait"


def test_collective_before_init_raises_not_initialized() -> None:
    code = (
        "import torch, hvd_compress.torch as hc\n"
        "try:\n    hc.allreduce(torch.ones(2))\nexcept hc.NotInitializedError as e:\n    print('OK', e)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=mpi_env(), cwd=ROOT, timeout=60, check=False
    )
    assert res.stdout.startswith("OK") and "hc.init()" in res.stdout, res.stdout + res.stderr


def test_gloo_only_horovodrun_launch_raises_launch_error_on_every_rank(out_dir) -> None:
    horovodrun("launch_mode.py", 2, out_dir, mode="--gloo", timeout=120)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        for op, error in rk["errors"].items():
            assert error.startswith("LaunchError") and "--mpi" in error, f"rank {r} op {op}: {error}"


