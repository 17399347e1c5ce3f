"""Horovod's ``hvd.join()`` with hvd_compress's ops: uneven data raises on every rank at once, naming the rank that
joined, where the ranks still stepping waited for it until the timeout; even data joins; Horovod's own join is
untouched while hvd_compress is not in use (``workers/join.py``). The core's side: cpp/tests/test_runtime.cc."""

from __future__ import annotations

import pytest
from mpi_harness import load_pickled_ranks, load_ranks, mpirun

TIMEOUT = {"HVDC_TIMEOUT": "60"}  # a regression fails in a minute, not at the 300 s default


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_uneven_data_raises_on_every_rank_naming_the_rank_that_joined(n: int, out_dir) -> None:
    mpirun("join.py", n, out_dir, "ops", env=TIMEOUT, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        for name in ("onebit", "average"):
            where = f"{name}, rank {r} of {n}"
            assert rk[f"{name}_even"] == "no error", f"{where}: even data: {rk[f'{name}_even']}"
            assert isinstance(rk[f"{name}_even_last"], int), f"{where}: hvd.join() returned {rk[f'{name}_even_last']}"
            assert rk[f"{name}_hc_join"] == "no error", f"{where}: hc.join(): {rk[f'{name}_hc_join']}"
            got = rk[f"{name}_uneven"]
            assert got.startswith("MismatchError") and f"rank(s) {n - 1} called join()" in got, f"{where}: {got}"
            assert "uneven data" in got and "CommTimeoutError" not in got, f"{where}: {got}"
            assert rk[f"{name}_after"] == n, f"{where}: the collective after gave {rk[f'{name}_after']}"


def test_horovods_own_join_untouched_while_hvd_compress_is_unused(out_dir) -> None:
    mpirun("join.py", 3, out_dir, "horovod", env=TIMEOUT, timeout=240)
    ranks = load_ranks(out_dir, 3)
    for r, rk in enumerate(ranks):
        assert rk["horovod_uneven"] == "no error", f"rank {r}: {rk['horovod_uneven']}"
        # Rank 2 ran out first; one of the ranks that stepped on joined last, the same answer on every rank.
        assert rk["horovod_last"] in (0, 1), f"rank {r}: the last rank to join was {rk['horovod_last']}"
        assert rk["horovod_last"] == ranks[0]["horovod_last"], f"rank {r}: another last rank than rank 0's"
        assert not rk["hc_initialized"], f"rank {r}: hvd_compress's runtime started without being used"


def test_tensorflow_join_with_hvd_compress_keras(out_dir) -> None:
    pytest.importorskip("horovod.tensorflow")
    mpirun("keras_join.py", 2, out_dir, env=TIMEOUT, timeout=240)
    for r, rk in enumerate(load_pickled_ranks(out_dir, 2)):
        assert rk["even"] == "no error", f"rank {r}: {rk['even']}"
        assert rk["uneven"].startswith("MismatchError") and "rank(s) 1 called join()" in rk["uneven"], rk["uneven"]
        assert rk["after"] == 2, f"rank {r}: the collective after gave {rk['after']}"
