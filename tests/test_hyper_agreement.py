"""Hyper-parameters that differ between ranks raise MismatchError on every rank, at no cost in calls: each bucket's
collective carries a hash of its param group's hyper-parameters in its name, which the core compares before any data
moves (``algorithms.agreement.tagged``). Under an algorithm op, the keys its rule reads; under op=Average (with
top-k, with PowerSGD), every plain entry of the wrapped optimizer's groups. Real processes at 2, 3 and 4 ranks,
every op with and without overlap (top-k: without; workers/hyper_agreement.py)."""

from __future__ import annotations

import re

import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_ranks_whose_lr_differs_raise_mismatch_on_every_rank_state_unchanged(n: int, out_dir) -> None:
    mpirun("hyper_agreement.py", n, out_dir, timeout=300)
    ranks = [rk["results"] for rk in load_ranks(out_dir, n)]
    assert len(ranks[0]) == 17, sorted(ranks[0])
    for case, res in ranks[0].items():
        for r, rk in enumerate(ranks):
            got = rk[case]
            caught = got["caught"]
            assert caught.startswith("MismatchError") and "hyper-parameters" in caught, (case, r, caught)
            lr = "0.03" if r == n - 1 else "0.01"
            assert f"group 0: lr={lr}, " in caught and "group 1: lr=0.02, " in caught, (case, r, caught)
            # The core names the lr that differs, with every rank's value (an algorithm's bucket holds one group:
            # "lr"; op=Average's names carry every group: "lr (group 0)"), and not the one that agrees.
            rates = "".join(f" rank {q}={0.03 if q == n - 1 else 0.01};" for q in range(n))
            assert re.search(rf"\n  lr( \(group 0\))?:{rates}", caught), (case, r, caught)
            assert "lr (group 1):" not in caught and "rank 0=0.02" not in caught, (case, r, caught)
            # Refused as a whole: parameters and every state (the algorithm's included) as before the step.
            assert got["after_error"] == got["before"], (case, r)
            assert got["next"] == "no error", (case, r, got["next"])
            assert got["late_lr"] == "no error", (case, r, got["late_lr"])
            if case.split("/")[0] not in ("ZeroOneAdam", "SLAMB"):  # their local steps leave ranks apart until a sync
                assert got["params"] == res["params"], f"{case}: rank {r}'s parameters differ from rank 0's"
                assert got["end"] == res["end"], f"{case}: rank {r}'s parameters differ from rank 0's"


@pytest.mark.parametrize(("face", "n"), [("keras", 3), ("tf_keras", 2),
                                           pytest.param("keras", 4, marks=pytest.mark.long)])
def test_keras_ranks_whose_learning_rate_differs_raise_on_every_rank(face: str, n: int, out_dir) -> None:
    mpirun("keras_hyper_agreement.py", n, out_dir, face, timeout=400, env=keras_face_env(face))
    ranks = [rk["results"] for rk in load_pickled_ranks(out_dir, n)]
    assert len(ranks[0]) == 8, sorted(ranks[0])
    for op in ranks[0]:
        for r, rk in enumerate(ranks):
            got = rk[op]
            caught = got["caught"]
            assert "MismatchError" in caught and "hyper-parameters" in caught, (op, r, caught)
            assert got["after_error"] == got["before"], (op, r)
            assert got["next"] == "no error", (op, r, got["next"])
        # Each rank lists its own learning rate, first: the last rank's differs from the others'.
        listed = [rk[op]["caught"].split("This rank's: ")[1].split(",")[0] for rk in ranks]
        assert all(x.startswith(("group 0: lr=", "group 0: learning_rate=")) for x in listed), (op, listed)
        assert len(set(listed[:-1])) == 1 and listed[-1] != listed[0], (op, listed)
        # ... and the core names the learning rate that differs (read from a float32 variable), with each rank's.
        assert re.search(r"\n  (lr|learning_rate): rank 0=0\.0099\d*; rank 1=0\.0", ranks[0][op]["caught"]), (
            op, ranks[0][op]["caught"])
    # Optimizer wrappers that differ between ranks: the message names what differs, with every rank's value, and
    # does not blame hyper-parameters that are equal.
    differs = [rk["differs"] for rk in load_pickled_ranks(out_dir, n)]
    ops = "".join(f" rank {r}={'OneBitAdam' if r == 0 else 'Average'};" for r in range(n))
    freeze = "".join(f" rank {r}={10 if r == 0 else 20};" for r in range(n))
    for r, d in enumerate(differs):
        for case, text in d.items():
            assert "MismatchError" in text, (face, n, r, case, text)  # inside a tf.function: an UnknownError
            assert "lr, momentum, betas, eps or weight decay" not in text and "hyper-parameters" not in text, (
                face, n, r, case, text)
        assert f"\n  op:{ops}" in d["op"], (face, n, r, d["op"])
        assert f"\n  freeze_step:{freeze}" in d["freeze_step"], (face, n, r, d["freeze_step"])
        assert "\n  op:" not in d["freeze_step"], (face, n, r, d["freeze_step"])
        callback = d["callback"]
        assert "The ranks' optimizers differ" in callback and "\n  optimizer: rank 0=DistributedOptimizer(op=" \
            "OneBitAdam, freeze_step=10) around Adam;" in callback, (face, n, r, callback)
