"""examples/demo.py (``make demo``) at 2 ranks on shared memory for 2 steps per op: it says it runs on shared memory,
prints one table row per op with numbers that parse (step and held-out accuracy against Horovod's, the compressed
ops sending a fraction of the dense bytes), and writes the same table, the stamped rows as JSON and a PNG that
decodes, its path the last line of the output."""

from __future__ import annotations

import json
import math
import sys

import pytest
from mpi_harness import ROOT, launch, mpi_env

OPS = ("Horovod Adam", "hc Average (Adam)", "hc Adasum (Adam)", "hc OneBitAdam", "hc ZeroOneAdam",
       "hc PowerSGD r4 (Adam)", "hc OneBitLamb", "hc SLAMB", "hc Birder")


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0] in OPS:
            rows[cells[0]] = cells
    return rows


def test_demo_prints_its_table_and_writes_a_png_at_two_ranks_on_shared_memory(tmp_path) -> None:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "2", "--warmup", "1", "--seconds", "60",
           "--out", str(tmp_path)]
    proc = launch(cmd, timeout=180, env=mpi_env({"HVDC_BENCH_NET": ""}))
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert "running on shared memory" in out, out[-3000:]
    rows = _table_rows(out)
    assert set(rows) == set(OPS), f"table rows {sorted(rows)}\n{out[-3000:]}"
    horovod_ms, horovod_accuracy = float(rows["Horovod Adam"][1]), float(rows["Horovod Adam"][3].rstrip("%"))
    for op, (_, ms, ratio, accuracy, points, sent, steps, train_loss, test_loss, reached) in rows.items():
        assert float(ms) > 0 and float(ratio.rstrip("x")) == pytest.approx(horovod_ms / float(ms), abs=0.06), (
            op, ms, ratio)
        assert float(points) == pytest.approx(float(accuracy.rstrip("%")) - horovod_accuracy, abs=0.16), (
            op, accuracy, points)
        assert int(steps) == 2, (op, steps)
        assert math.isfinite(float(train_loss)) and math.isfinite(float(test_loss)), (op, train_loss, test_loss)
        assert 0 <= float(accuracy.rstrip("%")) <= 100, (op, accuracy)
        assert reached == "not reached" or float(reached) >= 0, (op, reached)
        if op == "Horovod Adam":
            assert sent == "n/a", sent  # Horovod's bytes are counted only on the emulated link
        else:
            assert float(sent) > 0, (op, sent)
    for op in ("Horovod Adam", "hc Average (Adam)"):  # the target is Horovod's final loss; hc Average: the same step
        assert rows[op][9] != "not reached", rows[op]
    dense = float(rows["hc Average (Adam)"][5])
    for op in ("hc OneBitAdam", "hc OneBitLamb", "hc Birder"):  # past freeze_step=1: 1 bit per element
        assert float(rows[op][5]) * 20 < dense, (op, rows[op][5], dense)

    stem = tmp_path / "demo_shm_np2"
    assert _table_rows(stem.with_suffix(".md").read_text()) == rows
    summary = json.loads(stem.with_suffix(".json").read_text())
    assert summary["ranks"] == 2 and summary["net"] == ""
    assert summary["stamp"]["kind"] == "demo" and summary["stamp"]["ranks"] == 2 and summary["stamp"]["machine"]
    assert [r["method"] for r in summary["rows"]] == list(OPS)
    png = tmp_path / "demo_shm_np2.png"
    assert out.strip().splitlines()[-1] == f"[demo] plot: {png}", out[-500:]
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, image.shape
