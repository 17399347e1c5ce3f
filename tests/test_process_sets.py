"""Process sets on real processes at 3 and 4 ranks: evens and odds reduce at the same time on disjoint sets, the
first n-1 ranks on an overlapping one; every result against NumPy over the set's ranks, and every error on every
rank (of the set, or of the world for add_process_set). ``hc``: the sets come from hc.init/hc.add_process_set;
``hvd``: from hvd.init(process_sets=...), passed to hc as they are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import load_ranks, mpirun
from workers.common import rank_input


@pytest.fixture(scope="module", params=[(3, "hc"), (4, "hc"), (4, "hvd")], ids=lambda p: f"n{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory) -> tuple[int, str, list[dict]]:
    n, mode = request.param
    out = tmp_path_factory.mktemp(f"process_sets_{n}_{mode}")
    mpirun("process_sets.py", n, out, mode, timeout=300)
    return n, mode, load_ranks(out, n)


def _x(r: int) -> np.ndarray:
    return rank_input(r, 1000, torch.float64, seed=1).numpy()


def _close(got, want, what: str, tol: float = 1e-12) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    err = float(np.abs(got - want).max()) if got.size else 0.0
    assert err <= tol, f"{what}: off by {err:.3g}"


def test_collectives_over_each_set_match_numpy(ranks) -> None:
    n, mode, saved = ranks
    for r, rk in enumerate(saved):
        members = list(range(r % 2, n, 2))
        where = f"n={n} {mode} rank {r} on {members}"
        assert rk["mine"] == members, where
        assert rk["rank_size"] == (members.index(r), len(members), True, r < n - 1), where
        total = sum(_x(s) for s in members)
        _close(rk["sum"], total, f"{where}: Sum")
        _close(rk["avg"], total / len(members), f"{where}: Average")
        _close(rk["max_"], np.max([_x(s) for s in members], axis=0), f"{where}: Max in place")
        _close(rk["grouped"][0], total[:10], f"{where}: grouped 0")
        _close(rk["grouped"][1], total[10:30], f"{where}: grouped 1")
        _close(rk["gather"], np.concatenate([np.full((s + 1, 2), float(s)) for s in members]), f"{where}: allgather")
        root = members[-1]
        _close(rk["bcast"], _x(root), f"{where}: broadcast from world rank {root}")
        _close(rk["bcast_"], _x(root), f"{where}: broadcast_ from world rank {root}")
        assert rk["object"] == {"from": root}, where
        assert rk["objects"] == [s * 10 for s in members], where
        _close(rk["async"], total, f"{where}: allreduce_async")
        _close(rk["world"], np.full(3, float(n)), f"{where}: the world's allreduce meanwhile")
        _close(rk["grad"], np.full(5, float(len(members))), f"{where}: gradient of a Sum over the set")
        if r < n - 1:
            _close(rk["first_sum"], sum(_x(s) for s in range(n - 1)), f"{where}: Sum over the first {n - 1}")
        assert rk["stats"]["bytes_sent"] > 0, where


def _train(members: list[int], me: int, op: str) -> list[np.ndarray]:
    """train() of the worker in one process: each step's gradient reduced over ``members`` (just ``me`` if it is
    not one of them)."""
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    takes = members if me in members else [me]
    for step in range(3):
        grads = []
        for s in takes:
            gen = torch.Generator().manual_seed(10 * step + s)
            data, target = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(data), target).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            g = sum(gs[i] for gs in grads)
            p.grad = g / len(takes) if op == "avg" else g
        opt.step()
    return [p.detach().numpy() for p in model.parameters()]


def test_distributed_optimizer_over_a_set_matches_the_set_average(ranks) -> None:
    n, mode, saved = ranks
    for r, rk in enumerate(saved):
        members = list(range(r % 2, n, 2))
        for key, op, over in (("opt_avg", "avg", members), ("opt_sum", "sum", members),
                              ("opt_first", "avg", list(range(n - 1)))):
            want = _train(over, r, op)
            for i, (got, w) in enumerate(zip(rk[key], want, strict=True)):
                _close(got.numpy(), w, f"n={n} {mode} rank {r}: {key} over {over} parameter {i}", tol=1e-6)
        for key in ("opt_adasum", "opt_onebit"):
            assert rk[key].startswith("ProcessSetError") and "op=hc.Average" in rk[key], f"rank {r}: {key} {rk[key]}"


def test_errors_on_every_rank(ranks) -> None:
    n, mode, saved = ranks
    for r, rk in enumerate(saved):
        where = f"n={n} {mode} rank {r}"
        if r == n - 1:
            for key in ("outside", "outside_async"):
                assert rk[key].startswith("NotInProcessSetError") and f"rank {r}" in rk[key], f"{where}: {rk[key]}"
        else:
            assert rk["outside"] == rk["outside_async"] == "no error", where
        if len(rk["mine"]) > 1:
            assert rk["bad_shape"].startswith("MismatchError"), f"{where}: {rk['bad_shape']}"
            assert f"world rank {rk['mine']}[k]" in rk["bad_shape"], f"{where}: {rk['bad_shape']}"
            assert rk["bad_dtype"].startswith("RejectedInputError"), f"{where}: {rk['bad_dtype']}"
        assert rk["bad_root"].startswith("ValueError: broadcast root_rank"), f"{where}: {rk['bad_root']}"
        if mode != "hc":
            continue
        for key in ("add_out_of_range", "add_one_rank_bad", "add_differing", "add_duplicate"):
            assert rk[key].startswith("ValueError: add_process_set"), f"{where}: {key}: {rk[key]}"
        assert f"ranks [{n + 3}] are not ranks" in rk["add_out_of_range"], where
        assert ("'1' is not an integer" if r == 0 else "ranks [0] passed") in rk["add_one_rank_bad"], where
        assert rk["add_all"] is True, where
        assert rk["not_a_set"].startswith("ProcessSetError"), where
        assert rk["removed"] is True and rk["removed_twice"] is False and rk["remove_global"] is False, where
        assert rk["removed_use"].startswith("ValueError") and "not registered" in rk["removed_use"], where
        _close(rk["after_errors"], sum(_x(s) for s in rk["mine"]), f"{where}: the set after the errors")
