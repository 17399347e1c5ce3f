"""The test harness's MPI pools (``mpi_pool``): a job finds the process as a launch of its own would (no
environment, no hvd_compress runtime, no switch of Horovod's entry points left by the job before; nor does a case of
a ``Cases`` launch), and a job that
raises or hangs fails its test with its own output and does not take the next job with it."""

from __future__ import annotations

import json
import os
import re
import time

import mpi_pool
import pytest
from mpi_harness import mpirun

pytestmark = pytest.mark.skipif(not mpi_pool.enabled(), reason="HVDC_TEST_POOL=0: no pools to test")
#: Whether a fresh process routes Horovod's entry points (hvd_compress.ops.horovod_entry: on unless switched off).
ROUTING = os.environ.get("HVDC_HOROVOD_ENTRY", "1").strip() != "0"


def _found(out, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_a_pooled_job_finds_no_state_of_the_job_before(tmp_path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    mpirun("pool_probe.py", 2, first, "leave", env={"PROBE": "first"})
    mpirun("pool_probe.py", 2, second, "leave")
    for a, b in zip(_found(first), _found(second), strict=True):
        assert a["pid"] == b["pid"], "the second job did not run on the first one's pool"
        assert a["probe"] == "first" and b["probe"] is None, "the first job's environment reached the second"
        assert b["left"] is None, "an environment variable the first job set reached the second"
        assert not b["initialized"], "hvd_compress's runtime of the first job was still up in the second"
        assert b["routing"] == ROUTING, "the first job's horovod_entry(False) reached the second"


def test_each_case_of_a_cases_launch_finds_no_state_of_the_case_before(tmp_path) -> None:
    # Cases' launch runs its cases in one process per rank, each put back as the pool puts back its jobs
    specs = [json.dumps({"args": ["leave"], "env": {"PROBE": "first"}}), json.dumps({"args": ["leave"]})]
    mpirun("../mpi_harness.py", 2, tmp_path, "pool_probe.py", *specs)
    for a, b in zip(_found(tmp_path / "case0"), _found(tmp_path / "case1"), strict=True):
        assert a["pid"] == b["pid"], "the two cases did not run in one process"
        assert a["probe"] == "first" and b["probe"] is None, "the first case's environment reached the second"
        assert b["left"] is None, "an environment variable the first case set reached the second"
        assert not b["initialized"], "hvd_compress's runtime of the first case was still up in the second"
        assert b["routing"] == ROUTING, "the first case's horovod_entry(False) reached the second"


def test_a_job_that_raises_fails_with_its_output_and_the_next_one_runs_on_a_new_pool(tmp_path) -> None:
    """The error's first line names the rank, the op and the step (the worker's locals ``op`` and ``step``) and the
    worker's line, and it holds that rank's traceback once: not every rank's."""
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir(), good.mkdir()
    with pytest.raises(AssertionError, match="pool_probe: rank 1 raised") as failed:
        mpirun("pool_probe.py", 2, bad, "raise")
    first = str(failed.value).splitlines()[0]
    assert re.fullmatch(r"rank 1 of 2, op OneBitAdam, step 2, at pool_probe\.py:\d+: RuntimeError: pool_probe: "
                        r"rank 1 raised", first), first
    assert str(failed.value).count("Traceback (most recent call last)") == 1, str(failed.value)
    mpirun("pool_probe.py", 2, good, "leave")
    assert {f["pid"] for f in _found(bad)}.isdisjoint(f["pid"] for f in _found(good))
    assert not any(f["initialized"] or f["left"] for f in _found(good))


def test_a_job_that_hangs_is_stopped_at_its_timeout(tmp_path) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError, match="job hung"):
        mpirun("pool_probe.py", 2, tmp_path, "hang", timeout=5)  # rank 0 sleeps 60 s: it must not be waited for
    assert time.monotonic() - start < 30


def test_a_torch_pool_is_closed_for_room_before_a_tensorflow_one(monkeypatch) -> None:
    # Keys as mpi_harness makes them, (rank count, face, tf_keras), in order of last use; no pool is started here.
    order = [(3, "tf", False), (2, "torch", False), (2, "tf", True), (4, "torch", False)]
    monkeypatch.setattr(mpi_pool, "_pools", dict.fromkeys(order))
    assert mpi_pool._evictee() == (2, "torch", False), "not the least recently used torch pool"
    monkeypatch.setattr(mpi_pool, "_pools", dict.fromkeys([(3, "tf", False), (2, "tf", True)]))
    assert mpi_pool._evictee() == (3, "tf", False), "with no torch pool, not the least recently used TensorFlow one"
