"""The end-to-end bench's plumbing (hvd_compress/bench/e2e.py), not its figures: which methods a run picks, how a
method that cannot run here is reported, and a tiny real run at 2 ranks on a machine without Horovod and
TensorFlow (hidden from the ranks' imports), as the GPU machine is: Horovod's rows say so, the DDP and hc rows run,
hc.PowerSGD sends a small fraction of a dense step's bytes, and the stamp names the ranks and the network."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mpi_harness import ROOT, launch, mpi_env

from hvd_compress.bench import e2e, e2e_summary, tables

# Puts a finder in front of Python's that finds none of these packages, as where they are not installed.
HIDE = '''import sys
HIDDEN = ("horovod", "tensorflow", "keras", "tf_keras", "tensorboard")
class _Hide:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in HIDDEN else self.inner.find_spec(name, path, target)
    def __getattr__(self, key):
        return getattr(self.inner, key)
sys.meta_path[:] = [_Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def test_only_takes_names_and_shell_patterns_in_the_benchs_order() -> None:
    everything = e2e.methods(15)
    names = [m.name for m in e2e.select(everything, "*PowerSGD*, hc ZeroOneAdam,floor Adam*")]
    assert names == ["DDP+PowerSGD r4 Adam", "hc PowerSGD r4 (Adam)", "hc ZeroOneAdam", "floor Adam (no comm)"]
    assert [m.name for m in e2e.select(everything, "")] == [m.name for m in everything]


def test_zero_one_adam_runs_with_its_frozen_variance_bias_corrected(monkeypatch) -> None:
    """The shared lr diverges under DeepSpeed's 0/1 Adam after a 15-step freeze (docs/algorithms/zero-one-adam.md):
    its row runs at that lr with ``variance_bias_correction`` and the bench's 0/1 Adam options."""
    import torch

    monkeypatch.setattr(e2e, "_hc", lambda op, **options: lambda model, opt: (model, (op, options, opt)))
    method = {m.name: m for m in e2e.methods(15)}["hc ZeroOneAdam"]
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    _, (op, options, wrapped) = method.wrap(None, adam)
    assert op is e2e.hc.ZeroOneAdam and wrapped is adam
    assert options == {"var_freeze_step": 15, "local_step_scaler": 1, "local_step_clipper": 16,
                       "variance_bias_correction": True}
    assert adam.param_groups[0]["lr"] == 1e-3
    _, (op, options, _) = {m.name: m for m in e2e.methods(15)}["hc ZeroOneAdam sync/4"].wrap(None, adam)
    assert op is e2e.hc.ZeroOneAdam and options["local_step_clipper"] == 4, options
    _, (op, options, _) = {m.name: m for m in e2e.methods(15)}["hc ZeroOneAdam reset m"].wrap(None, adam)
    assert options == {"var_freeze_step": 15, "local_step_scaler": 1, "local_step_clipper": 16,
                       "variance_bias_correction": True, "reset_momentum_at_sync": True}, options


def test_only_refuses_a_pattern_that_matches_no_method() -> None:
    with pytest.raises(ValueError, match="'hc PowerSGD r8' match no method"):
        e2e.select(e2e.methods(15), "hc ZeroOneAdam,hc PowerSGD r8")


def test_both_powersgd_rows_use_the_same_options_and_only_horovods_rows_need_horovod() -> None:
    by_name = {m.name: m for m in e2e.methods(15)}
    assert e2e.POWERSGD == {"matrix_approximation_rank": 4, "start_powerSGD_iter": 2}
    assert {"DDP+PowerSGD r4 Adam", "hc PowerSGD r4 (Adam)", "hc ZeroOneAdam"} <= set(by_name)
    assert by_name["hc PowerSGD r4 (Adam)"].hc_bytes and not by_name["DDP+PowerSGD r4 Adam"].hc_bytes
    assert {n for n, m in by_name.items() if m.needs_horovod} == {n for n in by_name if n.startswith("Horovod")}
    assert {"hc PowerSGD r4 (Adam)", "DDP+PowerSGD r4 Adam"} <= set(e2e_summary.COMPRESSED)


def _run(method: str, ms: float, skipped: str | None = None) -> e2e.Run:
    if skipped:
        return e2e.Run(method, "mlp", skipped=skipped)
    return e2e.Run(method, "mlp", step_ms=[ms] * 4, losses=[1.0, 0.9, 0.8, 0.7], wall_s=[0.1, 0.2, 0.3, 0.4],
                   hc_bytes_per_step=1000.0 if method.startswith("hc") else None)


def test_a_skipped_method_is_a_row_that_says_why_in_every_table() -> None:
    runs = [_run("hc Average (Adam)", 20.0), _run("Horovod Adam", 0, "no Horovod"), _run("floor Adam (no comm)", 10.0)]
    rows = e2e.summarize(runs, warmup=2, size=2)
    by_method = {r["method"]: r for r in rows}
    assert by_method["Horovod Adam"] == {"model": "mlp", "method": "Horovod Adam", "skipped": "no Horovod"}
    assert by_method["hc Average (Adam)"]["ratio_to_floor"] == 2.0
    args = type("Args", (), {"batch": 32, "steps": 4, "warmup": 2, "budget": 1.0})()
    table = e2e.markdown(rows, "shm", 2, args)
    line = next(x for x in table.splitlines() if "Horovod Adam" in x)
    assert "skipped: no Horovod" in line and line.count("|") == table.splitlines()[2].count("|"), table
    assert "or 1 s, whichever came first" in table
    summary = e2e_summary.table({"label": "shm", "rows": rows}, 2)
    assert "| Horovod Adam | skipped: no Horovod |" in summary, summary


def test_the_held_out_loss_over_seeds_is_the_mean_against_the_dense_mean_at_each_runs_step_count() -> None:
    """Ratio of means, each seed's dense loss read at that seed's own step count (a budget can end seeds apart)."""
    run = _run("hc ZeroOneAdam", 20.0)
    run.seeds = [{"seed": 0, "steps": 4, "test_loss": 0.3}, {"seed": 7, "steps": 2, "test_loss": 0.1}]
    seed_refs = {"mlp": {"0": {"adam": [9.0, 9.0, 9.0, 0.1]}, "7": {"adam": [9.0, 0.3, 9.0, 9.0]}}}
    row = e2e.summarize([run], warmup=2, size=2, seed_references=seed_refs)[0]
    assert row["seeds"] == [0, 7] and row["seed_dense_test_losses"] == [0.1, 0.3], row
    assert abs(row["test_loss_vs_dense_over_seeds"]) < 1e-12, row  # (0.3 + 0.1) / (0.1 + 0.3) - 1
    # Per seed 3x and 1/3x: the geometric mean is even, and two seeds that far apart resolve nothing.
    assert "| mlp | hc ZeroOneAdam | 0.3000 / 0.1000, 0.1000 / 0.3000 | 0.2000 | 0.2000 | +0.0% | +0% [-100%, " in \
        tables.e2e_seeds([row]), tables.e2e_seeds([row])
    # Without further seeds, or with a seed the references lack, a row claims nothing over seeds.
    assert e2e.summarize([_run("hc ZeroOneAdam", 20.0)], warmup=2)[0]["test_loss_vs_dense_over_seeds"] is None
    del seed_refs["mlp"]["7"]
    assert e2e.summarize([run], warmup=2, seed_references=seed_refs)[0]["test_loss_vs_dense_over_seeds"] is None
    assert tables.e2e_seeds([row | {"test_loss_vs_dense_over_seeds": None}]) == ""


def test_the_paired_ratio_over_seeds_is_the_geometric_mean_with_students_t_interval() -> None:
    """Against scipy's own t interval on the log ratios, and the cases that claim nothing or everything."""
    import numpy as np
    from scipy import stats

    losses, dense = [0.0267, 0.0699, 0.0350, 0.0561, 0.0278, 0.0332], [0.0211, 0.0287, 0.0432, 0.1153, 0.0502, 0.0339]
    logs = np.log(np.array(losses) / np.array(dense))
    lo, hi = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    got = tables.paired_ratio(losses, dense)
    assert np.allclose(got, np.expm1([logs.mean(), lo, hi]), rtol=1e-12), got
    assert got[1] < -0.4 and got[2] > 0.6  # these six seeds cannot tell -40% from +60%
    assert tables.paired_ratio([0.2, 0.4], [0.1, 0.2]) == pytest.approx((1.0, 1.0, 1.0))  # the same ratio: exact
    assert tables.paired_ratio([0.2], [0.1]) is None
    center, lo, hi = tables.paired_ratio([0.2, 0.1], [0.1, 0.2], level=0.5)
    assert lo < 0 < hi and center == pytest.approx(0.0)


def test_e2e_runs_at_2_ranks_without_horovod_and_tensorflow(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    out = tmp_path / "out"
    only = "Horovod Adam,hc Average (Adam),*PowerSGD*,hc ZeroOneAdam,floor Adam (no comm)"
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "--bind-to", "none", sys.executable, "-m", "hvd_compress.bench.e2e",
           "--out", str(out), "--label", "shm", "--models", "mlp", "--only", only, "--steps", "6", "--warmup", "3",
           "--burnin", "0", "--fidelity-seeds", "1", "--eval-every", "4"]
    env = mpi_env({"PYTHONPATH": f"{hide}:{ROOT}"})
    env.pop("HVDC_BENCH_NET", None)
    res = launch(cmd, 240, env)
    assert res.returncode == 0, res.stdout[-6000:]
    assert "[e2e] mlp / Horovod Adam: skipped: no Horovod" in res.stdout, res.stdout[-3000:]
    result = json.loads((out / "e2e_shm_np2.json").read_text())
    assert result["stamp"]["ranks"] == 2 and result["stamp"]["net"] == "", result["stamp"]
    rows = {r["method"]: r for r in result["rows"]}
    assert rows["Horovod Adam"]["skipped"] == "no Horovod"
    for name in ("hc Average (Adam)", "DDP+PowerSGD r4 Adam", "hc PowerSGD r4 (Adam)", "hc ZeroOneAdam"):
        assert rows[name]["steps"] == 6 and rows[name]["median_step_ms"] > 0, rows[name]
    # PowerSGD from step 2: the 3 measured steps send P, Q and the biases, about 1% of the dense gradient.
    dense, low_rank = rows["hc Average (Adam)"]["hc_bytes_per_step"], rows["hc PowerSGD r4 (Adam)"]["hc_bytes_per_step"]
    assert 0 < low_rank <= 0.05 * dense, (low_rank, dense)
    # The dense reference, one process on every rank's batches, is hc Average's training to rounding; the floor
    # (each rank alone on its own batches) is not.
    reference = result["dense_reference"]["mlp"]["adam"]
    assert len(reference) == 6, reference
    average = rows["hc Average (Adam)"]
    assert average["dense_test_loss"] == reference[5], average
    assert abs(average["test_loss_vs_dense"]) < 1e-4, average
    assert abs(rows["floor Adam (no comm)"]["test_loss_vs_dense"]) > 1e-3, rows["floor Adam (no comm)"]
    # --fidelity-seeds: every method again from model seed 1, against the dense rule from that seed.
    assert set(result["seed_dense_reference"]["mlp"]) == {"0", "1"}
    assert average["seeds"] == [0, 1] and average["seed_dense_test_losses"][0] == reference[5], average
    assert average["seed_dense_test_losses"][1] == result["seed_dense_reference"]["mlp"]["1"]["adam"][5], average
    assert average["seed_test_losses"][1] != average["seed_test_losses"][0], average  # another model trained
    assert abs(average["test_loss_vs_dense_over_seeds"]) < 1e-4, average
    assert abs(rows["floor Adam (no comm)"]["test_loss_vs_dense_over_seeds"]) > 1e-3, rows["floor Adam (no comm)"]
    assert "| mlp | hc ZeroOneAdam | " in (out / "e2e_shm_np2.md").read_text().split("from model seeds 0, 1")[1]
    # --eval-every 4: the held-out curve at step 4 and the last, at those steps' training times; its last point is
    # the final held-out loss where the ranks' models agree.
    for run in (r for r in result["runs"] if not r["skipped"]):
        curve = run["test_curve"]
        assert [p[0] for p in curve] == [4, 6], run["method"]
        assert [p[1] for p in curve] == [run["wall_s"][3], run["wall_s"][5]] and curve[0][1] < curve[1][1], run
    hc_average = next(r for r in result["runs"] if r["method"] == "hc Average (Adam)")
    assert hc_average["test_curve"][-1][2] == average["test_loss"], (hc_average["test_curve"], average)


@pytest.mark.parametrize("seeds", ["0,1", "1,1", "x"])
def test_fidelity_seeds_are_refused_before_any_run(monkeypatch, capsys, seeds: str) -> None:
    """The timed seed again, a seed twice or a non-number: a usage error on every rank before MPI starts."""
    monkeypatch.setattr(sys, "argv", ["e2e", "--seed", "0", "--fidelity-seeds", seeds])
    with pytest.raises(SystemExit) as exc:
        e2e.main()
    assert exc.value.code == 2
    assert "--fidelity-seeds" in capsys.readouterr().err or seeds == "x"


def test_the_summary_takes_the_network_from_the_stamp_not_the_label() -> None:
    """A run behind a 100 Mbit/s link labelled by hand still shows [this / max(floor, wire time)]."""
    row = {"model": "mlp", "method": "hc PowerSGD r4 (Adam)", "median_step_ms": 50.0, "speedup_vs_horovod": 2.0,
           "ratio_to_limit": 1.25}
    networked = e2e_summary.table({"label": "shm", "rows": [row], "stamp": {"net": "100mbit"}}, 4)
    assert "| hc PowerSGD r4 (Adam) | 50 (2.0x) [1.25] |" in networked, networked
    local = e2e_summary.table({"label": "mine", "rows": [row], "stamp": {"net": ""}}, 4)
    assert "| hc PowerSGD r4 (Adam) | 50 (2.0x) |" in local, local


def test_the_summary_shows_the_mean_step_where_it_is_over_a_tenth_above_the_median() -> None:
    """0/1 Adam's sync steps make its mean its throughput; an even method's mean would only repeat the median."""
    rows = [{"model": "mlp", "method": "hc ZeroOneAdam", "median_step_ms": 81.2, "mean_step_ms": 105.4},
            {"model": "mlp", "method": "hc PowerSGD r4 (Adam)", "median_step_ms": 205.9, "mean_step_ms": 210.1},
            {"model": "mlp", "method": "floor Adam (no comm)", "median_step_ms": 100.0}]
    summary = e2e_summary.table({"label": "shm", "rows": rows}, 4)
    assert "| hc ZeroOneAdam | 81 {105} |" in summary, summary
    assert "| hc PowerSGD r4 (Adam) | 206 |" in summary and "| floor Adam (no comm) | 100 |" in summary, summary
    assert "{mean step ms, where over 10% above the median}" in summary, summary
