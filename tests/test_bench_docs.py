"""docs/benchmarks.md is what ``make bench-docs`` renders from the committed results (so the page cannot rot), and
the renderer turns a small hand-made result into the tables and stamp it should (hvd_compress/bench/report.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from hvd_compress.bench import report, stamp

ROOT = Path(__file__).resolve().parent.parent


def _stamp(kind: str, net: str, ranks: int, **extra) -> dict:
    return {"kind": kind, "commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False,
            "machine": {"cpu": "Test CPU 9000", "arch": "x86_64", "cores": 8, "memory_gib": 31.2}, "net": net,
            "ranks": ranks, "date": "2026-01-02 03:04 UTC", "command": ["python", "-m", "hvd_compress.bench.e2e",
                                                                         "--only", "Horovod Adam,hc OneBitAdam"],
            "settings": {}, "bench_env": "", **extra}


def _e2e_row(model: str, method: str, rule: str, ms: float, horovod_ms: float, limit: float | None,
             hc_bytes: float | None) -> dict:
    return {"model": model, "method": method, "median_step_ms": ms, "speedup_vs_horovod": horovod_ms / ms,
            "ratio_to_limit": limit, "hc_bytes_per_step": hc_bytes, "final_train_loss": 0.5, "test_loss": 0.25,
            "rule": rule}


def e2e_fixture() -> dict:
    rows = [
        _e2e_row("mlp", "Horovod Adam", "adam", 100.0, 100.0, 2.0, None),
        _e2e_row("mlp", "hc OneBitAdam", "adam", 10.0, 100.0, 1.25, 910_000.0),
        _e2e_row("cnn", "Horovod Adam", "adam", 50.0, 50.0, 1.0, None),
        _e2e_row("cnn", "hc OneBitAdam", "adam", 25.0, 50.0, 1.1, 64_000.0),
    ]
    return {"stamp": _stamp("e2e", "1gbit", 4), "label": "1gbit", "rows": rows, "args": {}}


def keras_fixture() -> dict:
    return {"stamp": _stamp("keras", "", 2), "label": "shm", "args": {"width": 8, "batch": 4, "steps": 12,
                                                                     "warmup": 2},
            "rows": [{"method": "OneBitAdam overlap", "step_ms": 12.345}, {"method": "floor adam", "step_ms": 3.0}]}


TEMPLATE = "# Page\n\nprose one\n\n{{results e2e}}\n\nprose two\n\n{{results keras}}\n"


def test_committed_page_is_what_make_bench_docs_renders() -> None:
    data = ROOT / "docs" / "bench-data"
    page = report.render((data / "benchmarks.md.in").read_text(), report.load(data))
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert committed == page, "docs/benchmarks.md differs from its results and template: run `make bench-docs`"


def test_every_committed_result_is_stamped_and_on_the_page() -> None:
    results = report.load(ROOT / "docs" / "bench-data")
    assert results, "docs/bench-data holds no result: the page would have no figure"
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, result in results.items():
        s = result["stamp"]
        assert s["commit"] and len(s["commit"]) == 40, f"{name}: no commit in its stamp"
        assert s["machine"]["cores"] and s["machine"]["cpu"], f"{name}: no machine in its stamp"
        assert f"(bench-data/{name})" in page, f"{name} is not on the page"


def test_render_gives_the_e2e_tables_and_stamp_of_a_fixture() -> None:
    page = report.render(TEMPLATE, {"e2e_1gbit_np4.json": e2e_fixture(), "keras_shm_np2.json": keras_fixture()})
    lines = page.splitlines()
    assert "| method | mlp | cnn |" in lines
    assert "| Horovod Adam | 100 | 50 |" in lines
    assert "| hc OneBitAdam | 10 (10.0x) [1.25] | 25 (2.0x) [1.10] |" in lines
    assert "| hc OneBitAdam | 0.910 MB, 0.500 / 0.250 | 0.064 MB, 0.500 / 0.250 |" in lines
    stamp_line = next(line for line in lines if line.startswith("Measured") and "e2e_1gbit_np4.json" in line)
    assert "2026-01-02 03:04 UTC" in stamp_line and "commit `0123456789`" in stamp_line
    assert "uncommitted" not in stamp_line
    assert "Test CPU 9000 (x86_64, 8 cores, 31.2 GiB), 4 ranks, an emulated 1gbit link" in stamp_line
    assert "`python -m hvd_compress.bench.e2e --only 'Horovod Adam,hc OneBitAdam'`" in stamp_line
    # The prose stays in place around the tables, in the template's order.
    assert page.index("prose one") < page.index("| Horovod Adam | 100") < page.index("prose two")
    assert page.index("prose two") < page.index("| OneBitAdam overlap | 12.3 |")
    assert "shared memory" in page.split("prose two")[1]


def test_render_marks_a_dirty_tree_and_a_kind_without_results() -> None:
    result = e2e_fixture()
    result["stamp"]["dirty"] = True
    page = report.render(TEMPLATE, {"e2e_1gbit_np4.json": result})
    assert "commit `0123456789` with uncommitted changes" in page
    assert "_No keras result in docs/bench-data/ yet._" in page


def test_render_refuses_an_unstamped_or_unplaced_result() -> None:
    unstamped = {k: v for k, v in e2e_fixture().items() if k != "stamp"}
    with pytest.raises(ValueError, match=r"old\.json has no stamp"):
        report.render(TEMPLATE, {"old.json": unstamped})
    with pytest.raises(ValueError, match=r"no place for keras_shm_np2\.json"):
        report.render("{{results e2e}}\n", {"keras_shm_np2.json": keras_fixture()})


def test_stamp_names_this_commit_and_machine_without_the_hostname(monkeypatch) -> None:
    monkeypatch.setenv("HVDC_BENCH_NET", "100mbit")
    monkeypatch.setenv("HVDC_BENCH_ENV", "HOROVOD_CYCLE_TIME=20")
    s = stamp.stamp("kernels", "hvd_compress.bench.kernels", 3)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert s["commit"] == head.stdout.strip()
    assert isinstance(s["dirty"], bool)
    assert s["machine"]["cores"] == os.cpu_count() and s["machine"]["memory_gib"] > 0
    assert (s["net"], s["ranks"], s["bench_env"]) == ("100mbit", 3, "HOROVOD_CYCLE_TIME=20")
    assert socket.gethostname() not in s["machine"].values() and "hostname" not in json.dumps(s)


def test_report_writes_the_page_and_check_fails_once_it_is_edited(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md.in").write_text(TEMPLATE)
    (tmp_path / "e2e_1gbit_np4.json").write_text(json.dumps(e2e_fixture()))
    page = tmp_path / "page.md"
    assert report.main(["--data", str(tmp_path), "--out", str(page)]) == 0
    assert report.main(["--data", str(tmp_path), "--out", str(page), "--check"]) == 0
    page.write_text(page.read_text().replace("| Horovod Adam | 100 | 50 |", "| Horovod Adam | 99 | 50 |"))
    assert report.main(["--data", str(tmp_path), "--out", str(page), "--check"]) == 1
