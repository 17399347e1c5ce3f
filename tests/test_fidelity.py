"""Fidelity (issue 4): on the teacher task (tests/workers/teacher_task.py) with 4 ranks, each 1-bit optimizer's
final held-out loss is within 2% of its uncompressed counterpart's (Adam, resp. hc.Lamb, with a dense average),
and the task writes the loss curves as a PNG."""

from __future__ import annotations

import json
import sys

import pytest
from mpi_harness import WORKERS, launch, mpi_env

pytestmark = pytest.mark.long  # the long tier (make test-long): docs/design.md, "Test tiers"


def test_onebit_optimizers_within_two_percent_of_dense(tmp_path) -> None:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           sys.executable, str(WORKERS / "teacher_task.py"), "--reductions", "Adam,OneBitAdam,Lamb,OneBitLamb",
           "--out", str(tmp_path)]
    proc = launch(cmd, timeout=600, env=mpi_env())
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["ranks"] == 4
    fidelity = summary["fidelity"]
    assert set(fidelity) == {"OneBitAdam", "OneBitLamb"}
    for name, rel in fidelity.items():
        assert abs(rel) <= 0.02, f"{name}: final loss {100 * rel:+.2f}% off dense\n{proc.stdout[-3000:]}"
    results = summary["results"]
    for name in ("OneBitAdam", "OneBitLamb"):  # it compressed: far fewer bytes than dense in the last epoch
        assert results[name]["mb_sent"] * 10 < results["Adam"]["mb_sent"]
    png = (tmp_path / "loss_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
