"""The race's arithmetic (hvd_compress/bench/race.py): time to target with censored seeds, the Student-t interval,
the equal-time lookup and the per-method summary; e2e's held-out curve with the clock stopped while evaluating
(on a fake clock: no timed assertion); and the race's table and PNG on the page (hvd_compress/bench/report.py)."""

from __future__ import annotations

import argparse
import sys
import types

import pytest
import torch

from hvd_compress.bench import e2e, race, report
from hvd_compress.bench.models import Data

CURVE = [[10, 1.0, 0.9], [20, 2.0, 0.5], [30, 3.0, 0.55], [40, 4.0, 0.3]]


def test_time_to_target_is_the_first_evaluation_at_or_below_it_and_none_when_censored() -> None:
    assert race.time_to_target(CURVE, 0.5) == 2.0  # at the target counts
    assert race.time_to_target(CURVE, 0.52) == 2.0
    assert race.time_to_target(CURVE, 0.4) == 4.0  # the first below, not a later rise
    assert race.time_to_target(CURVE, 0.1) is None
    assert race.time_to_target([], 1.0) is None


def test_loss_at_equal_time_is_the_last_evaluation_at_or_before_it() -> None:
    assert race.loss_at_time(CURVE, 3.0) == 0.55
    assert race.loss_at_time(CURVE, 3.9) == 0.55
    assert race.loss_at_time(CURVE, 100.0) == 0.3  # a run that ended earlier keeps its last model
    assert race.loss_at_time(CURVE, 0.5) is None


def test_mean_interval_leaves_out_a_diverged_runs_non_finite_loss() -> None:
    assert race.mean_interval([1.0, float("nan"), 3.0, float("inf")]) == race.mean_interval([1.0, 3.0])
    assert race.mean_interval([float("nan")]) is None


def test_mean_interval_is_students_t() -> None:
    from scipy import stats

    values = [2.0, 3.0, 7.0, 4.0, 5.0, 6.0]
    mean, lo, hi = race.mean_interval(values)
    want = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / len(values), scale=stats.sem(values))
    assert mean == pytest.approx(4.5) and (lo, hi) == pytest.approx(want, rel=1e-12)
    assert race.mean_interval([3.0]) == (3.0, None, None)
    assert race.mean_interval([]) is None


def _record(method: str, seed: int, step_ms: float, curve: list, dense: list[float], target: float) -> dict:
    run = e2e.Run(method, "mlp", step_ms=[step_ms] * 40, test_curve=curve)
    return {"model": "mlp", **race.seed_record(run, seed, 0, dense, target, equal_time=2.5)}


def test_summary_counts_censored_seeds_and_judges_each_seed_against_its_own_dense_and_floor() -> None:
    dense = [1.0] * 39 + [0.25]  # the dense reference at step 40
    records = [
        _record("hc A", 0, 20.0, CURVE, dense, 0.5),   # reaches at 2 s; last eval step 40: 0.3 / 0.25
        _record("hc A", 1, 30.0, CURVE, dense, 0.1),   # censored
        _record("hc A", 2, 40.0, CURVE, dense, 0.35),  # reaches at 4 s
        _record(race.FLOOR, 0, 10.0, CURVE, dense, 0.5),
        _record(race.FLOOR, 1, 10.0, CURVE, dense, 0.1),
        _record(race.FLOOR, 2, 20.0, CURVE, dense, 0.35),
    ]
    row = race.summarize(records, target_step=100)[0]
    assert row["method"] == "hc A" and (row["reached"], row["seeds"]) == (2, 3)
    assert row["time_to_target_s"][0] == pytest.approx(3.0)  # over the two that reached: censored is not a time
    assert row["test_loss_at_equal_time"][0] == pytest.approx(0.5)
    assert row["equal_steps_vs_dense"] == pytest.approx((0.2, 0.2, 0.2))  # 0.3 / 0.25 - 1 on every seed
    assert row["ratio_to_floor"][0] == pytest.approx((2.0 + 3.0 + 2.0) / 3)  # each seed against its own floor
    assert row["projected_s_to_target_step"] == pytest.approx(100 * 30.0 / 1e3)
    table = race.markdown(race.summarize(records, 100), "mlp", {"target_step": 100, "equal_time": 2.5, "n_seeds": 3,
                                                                 "steps": 40, "budget": 60.0, "eval_every": 10})
    line = next(x for x in table.splitlines() if x.startswith("| hc A |"))
    assert "| 2/3 |" in line and "| 3 |" in line, table  # reached, and the projection in its own column


class _Comm:
    """One rank's mpi4py communicator, for e2e.train in one process."""

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return 0

    def Get_size(self):  # noqa: N802 (mpi4py's names)
        return 1

    def Barrier(self):  # noqa: N802 (mpi4py's names)
        pass

    def bcast(self, v, root=0):
        return v

    def allreduce(self, v, op=None):
        return v

    def Allreduce(self, send, recv, op=None):  # noqa: N802 (mpi4py's names)
        recv[...] = send


def test_e2e_records_held_out_every_eval_every_steps_with_the_clock_stopped(monkeypatch) -> None:
    """A fake clock that ticks once per reading and jumps 1000 s in every evaluation: the step times and the time
    axis never see the jump."""
    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 1.0
        return clock[0]

    def slow_held_out(model, data):
        clock[0] += 1000.0
        return 0.5, 0.5

    monkeypatch.setattr(e2e, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(e2e, "held_out", slow_held_out)
    monkeypatch.setattr(e2e.hc, "comm_stats", lambda: {"bytes_sent": 0})
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(SUM=0, MAX=1)))
    data = Data(torch.randn(16, 64), torch.randint(0, 10, (16,)), torch.randn(8, 64), torch.randint(0, 10, (8,)))
    args = argparse.Namespace(seed=0, lr=1e-3, steps=7, warmup=1, batch=4, eval_every=2)
    method = next(m for m in e2e.methods(1) if m.name == "floor Adam (no comm)")
    run = e2e.train(method, "mlp", data, _Comm(), args, seconds=500.0, width=8, depth=1)
    assert len(run.step_ms) == 7  # the 500 s budget counts training only: 4000 s of evaluation do not end it
    assert [p[0] for p in run.test_curve] == [2, 4, 6, 7]  # and the last step, between evaluations
    assert [p[1] for p in run.test_curve] == [run.wall_s[1], run.wall_s[3], run.wall_s[5], run.wall_s[6]]
    walls = [p[1] for p in run.test_curve]
    assert walls == sorted(walls) and len(set(walls)) == 4
    assert max(b - a for a, b in zip(run.wall_s, run.wall_s[1:], strict=False)) < 100, run.wall_s
    assert max(run.step_ms) < 100e3, run.step_ms


def test_diloco_is_evaluated_on_its_synced_copy_and_batchnorm_in_eval_mode() -> None:
    """``_kept_model`` writes DiLoCo's synced copy over a copy of the model and leaves the model alone."""
    from hvd_compress.algorithms.diloco import DiLoCoOptions, DiLoCoState
    from hvd_compress.bench.models import build

    model, kept = build("cnn_bn", seed=0), build("cnn_bn", seed=1)
    params = [p for p in model.parameters()]
    state = DiLoCoState(DiLoCoOptions(sync_every=4, fragments=2))
    from hvd_compress.algorithms.diloco import fragment_members

    state.synced = [torch.cat([params[i].detach().reshape(-1) for i in m]).numpy() * 0 + 1.5
                    for m in fragment_members(len(params), 2)]
    opt = types.SimpleNamespace(diloco_state=state)
    before = [p.detach().clone() for p in params]
    out = e2e._kept_model(kept, model, opt)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(bool((p == 1.5).all()) for p in out.parameters())
    out.train()
    x = torch.randn(4, 64)
    e2e.held_out(out, Data(x, torch.zeros(4, dtype=torch.long), x, torch.zeros(4, dtype=torch.long)))
    assert out.training  # the mode restored
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in out.modules())


def _race_fixture() -> dict:
    dense = [1.0] * 40
    records = [_record(m, s, 20.0, CURVE, dense, 0.5) for s in (0, 1) for m in ("hc A", race.FLOOR)]
    args = {"target_step": 20, "equal_time": 2.5, "n_seeds": 2, "steps": 40, "budget": 60.0, "eval_every": 10}
    stamp = {"kind": "race", "commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False,
             "machine": {"cpu": "Test CPU", "arch": "x86_64", "cores": 2, "memory_gib": 8.0}, "net": "100mbit",
             "ranks": 2, "date": "2026-01-02 03:04 UTC", "command": ["python", "-m", "hvd_compress.bench.race"],
             "settings": {}, "bench_env": ""}
    return {"stamp": stamp, "label": "100mbit", "args": args, "records": records,
            "rows": {"mlp": race.summarize(records, 20)}}


def test_a_race_result_renders_its_table_stamp_and_png(tmp_path) -> None:
    results = {"race_100mbit_np2_mlp.json": _race_fixture()}
    page = report.render("# B\n\n{{results race}}\n", results)
    assert "### Race: 100 Mbit/s, 2 ranks, `mlp`" in page, page
    assert "| hc A | 2 [2, 2] | 2/2 |" in page, page
    assert "(img/bench/race-100mbit-np2-mlp-mlp.png)" in page, page
    assert "_No race result" in report.render("{{results race}}\n", {})
    pngs = report.render_pngs(results, tmp_path)
    assert [p.name for p in pngs] == ["race-100mbit-np2-mlp-mlp.png"] and pngs[0].stat().st_size > 0


def test_dense_reference_evaluates_every_eval_every_steps_and_the_last() -> None:
    import math

    from hvd_compress.bench.models import digits

    data, args = digits(0), argparse.Namespace(seed=0, lr=1e-3, batch=4)
    every = e2e.dense_reference("adam", "cnn_bn", data, args, 2, 5)
    sparse = e2e.dense_reference("adam", "cnn_bn", data, args, 2, 5, eval_every=2, also=frozenset({1}))
    assert [math.isnan(v) for v in sparse] == [False, False, True, False, False], sparse
    assert (sparse[1], sparse[3], sparse[4]) == (every[1], every[3], every[4])  # evaluating changes no training


def test_a_run_refused_for_a_non_finite_gradient_ends_there_as_diverged_and_other_errors_propagate(monkeypatch):
    """0/1 Adam with a short variance freeze diverges behind a slow link; the race counts it (every rank raises the
    agreed non-finite error alike) instead of losing the other methods' runs."""
    monkeypatch.setattr(e2e.hc, "comm_stats", lambda: {"bytes_sent": 0})
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(SUM=0, MAX=1)))
    data = Data(torch.randn(16, 64), torch.randint(0, 10, (16,)), torch.randn(8, 64), torch.randint(0, 10, (8,)))
    args = argparse.Namespace(seed=0, lr=1e-3, steps=7, warmup=1, batch=4, eval_every=2)

    def failing(message: str):
        def wrap(model, opt):
            class Opt:
                steps = 0

                def zero_grad(self):
                    opt.zero_grad()

                def step(self):
                    Opt.steps += 1
                    if Opt.steps == 3:
                        raise e2e.hc.UsageError(message)
                    opt.step()

            return model, Opt()

        return e2e.Method("failing", "adam", wrap)

    run = e2e.train(failing("X: non-finite gradient on some rank at step 3"), "mlp", data, _Comm(), args,
                    width=8, depth=1)
    assert run.diverged == 3 and len(run.step_ms) == 2, (run.diverged, run.step_ms)
    rec = race.seed_record(run, 0, 0, [1.0] * 7, 0.5, equal_time=2.5)
    assert rec["diverged"] == 3
    row = race.summarize([{"model": "mlp", **rec}], target_step=4)[0]
    table = race.markdown([row], "mlp", {"target_step": 4, "equal_time": 2.5, "n_seeds": 1, "steps": 7,
                                         "budget": 60.0, "eval_every": 2})
    assert "0/1 (1 diverged)" in table, table
    with pytest.raises(e2e.hc.UsageError, match="wrong shape"):
        e2e.train(failing("X: wrong shape"), "mlp", data, _Comm(), args, width=8, depth=1)
