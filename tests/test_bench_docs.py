"""docs/benchmarks.md, its PNGs and README's op table are what ``make bench-docs`` renders from the committed results
(so they cannot rot), and the renderer turns small hand-made results into the tables, figures and stamps it
should (hvd_compress/bench/report.py, e2e_results.py, op_guide.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from hvd_compress.bench import e2e_results, op_guide, plots, report, stamp

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


def _run(model: str, method: str, rule: str, step_ms: list[float]) -> dict:
    wall, t = [], 0.0
    for ms in step_ms:
        t += ms / 1e3
        wall.append(t)
    return {"model": model, "method": method, "rule": rule, "step_ms": step_ms, "wall_s": wall,
            "losses": [2.0 / (i + 1) for i in range(len(step_ms))]}


def e2e_fixture() -> dict:
    """A 1 Gbit/s, 4-rank run: the median steps as given, the means from the runs' steps after a warm-up of 1
    (the rows predate the bench recording them): Horovod 110 ms on the MLP, 1-bit Adam 11."""
    rows = [
        _e2e_row("mlp", "Horovod Adam", "adam", 100.0, 100.0, 2.0, None),
        _e2e_row("mlp", "hc OneBitAdam", "adam", 10.0, 100.0, 1.25, 910_000.0),
        _e2e_row("cnn", "Horovod Adam", "adam", 50.0, 50.0, 1.0, None),
        _e2e_row("cnn", "hc OneBitAdam", "adam", 25.0, 50.0, 1.1, 64_000.0),
    ]
    runs = [_run("mlp", "Horovod Adam", "adam", [900.0, 100.0, 100.0, 130.0]),
            _run("mlp", "hc OneBitAdam", "adam", [900.0, 10.0, 10.0, 13.0]),
            _run("cnn", "Horovod Adam", "adam", [900.0, 50.0, 50.0, 50.0]),
            _run("cnn", "hc OneBitAdam", "adam", [900.0, 25.0, 25.0, 25.0])]
    return {"stamp": _stamp("e2e", "1gbit", 4), "label": "1gbit", "rows": rows, "runs": runs,
            "args": {"warmup": 1}}


def e2e_compressed_only() -> dict:
    """Another run of the same link and ranks without a Horovod step (as a 300-step run beside a short dense
    one), a new method among its rows, its mean step recorded: 20 ms."""
    row = {**_e2e_row("mlp", "hc NewMethod", "adam", 18.0, float("nan"), None, 1_000.0), "mean_step_ms": 20.0}
    return {"stamp": _stamp("e2e", "1gbit", 4), "label": "1gbit-new", "rows": [row],
            "runs": [_run("mlp", "hc NewMethod", "adam", [30.0, 20.0, 16.0, 24.0])], "args": {"warmup": 1}}


def keras_fixture() -> dict:
    return {"stamp": _stamp("keras", "", 2), "label": "shm", "args": {"width": 8, "batch": 4, "steps": 12,
                                                                     "warmup": 2},
            "rows": [{"method": "OneBitAdam overlap", "step_ms": 12.345}, {"method": "floor adam", "step_ms": 3.0}]}


TEMPLATE = "# Page\n\nprose one\n\n{{results e2e}}\n\nprose two\n\n{{results keras}}\n"


def test_committed_page_is_what_make_bench_docs_renders() -> None:
    data = ROOT / "docs" / "bench-data"
    results = report.load(data)
    page = report.render((data / "benchmarks.md.in").read_text(), results)
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert committed == page, "docs/benchmarks.md differs from its results and template: run `make bench-docs`"
    readme = (ROOT / "README.md").read_text()
    assert op_guide.render_readme(readme, results) == readme, "README's op table differs: run `make bench-docs`"


def test_committed_pngs_are_what_make_bench_docs_renders() -> None:
    """Every e2e group's PNG is committed, linked from the page and, where this matplotlib drew it, byte-equal to
    a fresh render (another matplotlib draws other bytes from the same data: that comparison is skipped)."""
    results = report.load(ROOT / "docs" / "bench-data")
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    groups = e2e_results.groups(results)
    assert groups, "no e2e result to plot"
    for group in groups:
        assert f"(img/bench/{report.png_name(group)})" in page, f"{group.title}: its PNG is not on the page"
    assert report.stale_pngs(results, report.IMG) == [], "run `make bench-docs`"
    drawn_by = {report.png_software(p) for p in report.IMG.glob("*.png")}
    if drawn_by != {plots.software()}:
        pytest.skip(f"the committed PNGs were drawn by {sorted(map(str, drawn_by))}, not {plots.software()}: "
                    "their bytes were not compared")


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
    assert '<a id="e2e-1gbit-np4"></a>' in lines and "### 1 Gbit/s, 4 ranks" in lines
    # No dense reference, no seeds: those columns are left out. Means from the runs after the warm-up step.
    assert ("| run | model | method | median step ms | mean step ms | Horovod / this | MB / step / rank | "
            "held-out loss |") in lines
    run = "[1gbit](#run-e2e-1gbit-np4)"
    assert f"| {run} | mlp | Horovod Adam | 100.0 | 110.0 |  |  | 0.2500 |" in lines
    assert f"| {run} | mlp | hc OneBitAdam | 10.0 | 11.0 | 10 | 0.910 | 0.2500 |" in lines
    assert f"| {run} | cnn | hc OneBitAdam | 25.0 | 25.0 | 2.00 | 0.064 | 0.2500 |" in lines
    stamp_line = next(line for line in lines if line.startswith('<a id="run-e2e-1gbit-np4"></a>'))
    assert "2026-01-02 03:04 UTC" in stamp_line and "commit `0123456789`" in stamp_line
    assert "uncommitted" not in stamp_line
    assert "Test CPU 9000 (x86_64, 8 cores, 31.2 GiB), 4 ranks (2 cores per rank), an emulated 1gbit link" in stamp_line
    assert "`python -m hvd_compress.bench.e2e --only 'Horovod Adam,hc OneBitAdam'`" in stamp_line
    assert "(bench-data/e2e_1gbit_np4.json)" in stamp_line
    assert ("![1 Gbit/s, 4 ranks: training loss (these runs recorded held-out loss at the end only) against "
            "wall-clock time](img/bench/e2e-1gbit-np4.png)") in lines
    # A run with held-out curves (--eval-every) is drawn and captioned as held-out loss.
    curved = e2e_fixture()
    for r in curved["runs"]:
        r["test_curve"] = [[2, w, 0.5] for w in r["wall_s"][1:2]]
    page = report.render(TEMPLATE, {"e2e_1gbit_np4.json": curved, "keras_shm_np2.json": keras_fixture()})
    assert ("![1 Gbit/s, 4 ranks: held-out loss against wall-clock time](img/bench/e2e-1gbit-np4.png)"
            in page.splitlines()), page
    # The prose stays in place around the tables, in the template's order.
    assert page.index("prose one") < page.index("| mlp | Horovod Adam") < page.index("prose two")
    assert page.index("prose two") < page.index("| OneBitAdam overlap | 12.3 |")
    assert "shared memory" in page.split("prose two")[1]


def test_a_new_file_and_method_join_their_group_against_its_horovod_step() -> None:
    """A result file of a link and rank count already on the page joins that group's table and PNG, its new method
    a row, its ratio against the group's Horovod step of the same rule (110 / 20 ms: 5.50, marked as borrowed)."""
    results = {"e2e_1gbit_np4.json": e2e_fixture(), "e2e_1gbit-new_np4.json": e2e_compressed_only(),
               "e2e_shm_np2.json": {**e2e_fixture(), "stamp": _stamp("e2e", "", 2), "label": "shm"}}
    groups = e2e_results.groups(results)
    assert [(g.net, g.ranks, [n for n, _ in g.results]) for g in groups] == [
        ("", 2, ["e2e_shm_np2.json"]), ("1gbit", 4, ["e2e_1gbit-new_np4.json", "e2e_1gbit_np4.json"])]
    page = report.render(TEMPLATE.replace("\n\n{{results keras}}", ""), results)
    row = "| [1gbit-new](#run-e2e-1gbit-new-np4) | mlp | hc NewMethod | 18.0 | 20.0 | 5.50\\* | 0.001 | 0.2500 |"
    assert row in page
    assert "\\* against Horovod's step in e2e_1gbit_np4.json (same link, ranks and model)." in page
    assert page.count("### 1 Gbit/s, 4 ranks") == 1 and page.count("](img/bench/e2e-1gbit-np4.png)") == 1


def test_op_table_quotes_its_runs_and_says_not_measured_where_none_is(monkeypatch) -> None:
    results = {"e2e_1gbit_np4.json": e2e_fixture(), "e2e_1gbit-new_np4.json": e2e_compressed_only()}
    monkeypatch.setattr(op_guide, "SITUATIONS", (
        op_guide.Situation("1 Gbit/s", "Adam", "`op=hc.OneBitAdam`", "close", run="e2e_1gbit_np4.json",
                           method="hc OneBitAdam"),
        op_guide.Situation("1 Gbit/s", "any", "`op=hc.NewMethod`", "new", run="e2e_1gbit-new_np4.json",
                           method="hc NewMethod"),
        op_guide.Situation("10+ Gbit/s", "any", "`op=hc.Average`", "Horovod's rule"),
    ))
    readme = f"intro\n\n{op_guide.BEGIN}\nstale\n{op_guide.END}\n\nafter\n"
    out = op_guide.render_readme(readme, results)
    link = "([1 Gbit/s, 4 ranks](docs/benchmarks.md#e2e-1gbit-np4))"
    assert f"| 1 Gbit/s | Adam | `op=hc.OneBitAdam` | 10x {link} | close |" in out.splitlines()
    assert f"| 1 Gbit/s | any | `op=hc.NewMethod` | 5.5x {link} | new |" in out.splitlines()
    assert "| 10+ Gbit/s | any | `op=hc.Average` | not measured | Horovod's rule |" in out.splitlines()
    assert out.startswith("intro\n") and out.endswith("\nafter\n") and "stale" not in out
    assert op_guide.render_readme(out, results) == out
    del results["e2e_1gbit-new_np4.json"]
    with pytest.raises(KeyError, match=r"e2e_1gbit-new_np4\.json"):
        op_guide.render_readme(readme, results)
    with pytest.raises(ValueError, match="one op table"):
        op_guide.render_readme("no markers\n", results)


def test_pngs_render_byte_equal_and_check_catches_an_edited_one(tmp_path: Path) -> None:
    results = {"e2e_1gbit_np4.json": e2e_fixture()}
    first, second = tmp_path / "a", tmp_path / "b"
    [png] = report.render_pngs(results, first)
    report.render_pngs(results, second)
    assert png.read_bytes() == (second / png.name).read_bytes()
    assert report.png_software(png) == plots.software()
    assert report.stale_pngs(results, first) == []
    png.write_bytes(png.read_bytes()[:-20] + bytes(20))
    assert report.stale_pngs(results, first) == [f"{png} differs from its render"]
    png.unlink()
    (first / "e2e-old-np9.png").write_bytes(b"")
    assert report.stale_pngs(results, first) == [f"{png} missing", f"{first / 'e2e-old-np9.png'} is no group's PNG"]


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


def test_report_writes_the_page_and_check_fails_once_it_is_edited(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(op_guide, "SITUATIONS", (op_guide.Situation(
        "1 Gbit/s", "Adam", "`op=hc.OneBitAdam`", "close", run="e2e_1gbit_np4.json", method="hc OneBitAdam"),))
    (tmp_path / "benchmarks.md.in").write_text(TEMPLATE.replace("\n\n{{results keras}}", ""))
    (tmp_path / "e2e_1gbit_np4.json").write_text(json.dumps(e2e_fixture()))
    readme = tmp_path / "README.md"
    readme.write_text(f"{op_guide.BEGIN}\n{op_guide.END}\n")
    page = tmp_path / "page.md"
    args = ["--data", str(tmp_path), "--out", str(page), "--readme", str(readme)]
    assert report.main(args) == 0
    assert (tmp_path / "img" / "bench" / "e2e-1gbit-np4.png").is_file()
    assert report.main([*args, "--check"]) == 0
    text = page.read_text()
    page.write_text(text.replace("| mlp | Horovod Adam | 100.0 |", "| mlp | Horovod Adam | 99.0 |"))
    assert report.main([*args, "--check"]) == 1
    page.write_text(text)
    readme.write_text(readme.read_text().replace("| 1 Gbit/s |", "| 2 Gbit/s |", 1))
    assert report.main([*args, "--check"]) == 1
