"""hc.DistributedOptimizer(op=OneBitAdam/OneBitLamb) cuts its parameters into buckets (segments, each with its own
error feedback) and reduces them while backward runs (overlap=True, the default): dense gradient averages in
warm-up, the local momentum through the 1-bit compressed allreduce after. Results are bit-identical to reducing the
same buckets after backward (overlap=False); a NaN in a late bucket on one rank raises on every rank with every
state tensor unchanged; a checkpoint of another bucket layout is refused (issue 13, item 1)."""

from __future__ import annotations

import pytest
import torch
from mpi_harness import load_ranks, mpirun
from overlap_checks import check_buckets_started, check_checkpoint_layouts

STEPS, FREEZE = 7, 3  # 3 dense warm-up steps, then 4 compressed ones
BUCKETS = 5  # the worker's model cut into 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1]
CONFIGS = ["adam", "lamb", "adam_accum_groups", "lamb_accum", "lamb_abandoned"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n{n}")
def run(request, tmp_path_factory) -> tuple[int, list[dict]]:
    """One worker run per rank count serves every test below (each mpirun costs seconds)."""
    n = request.param
    out = tmp_path_factory.mktemp(f"onebit_overlap_{n}")
    mpirun("onebit_overlap.py", n, out, str(STEPS), str(FREEZE), env={"HVDC_TIMEOUT": "60"}, timeout=300)
    return n, load_ranks(out, n)


def test_buckets_start_during_backward_in_warmup_and_compression(run) -> None:
    # steps > FREEZE: the compressed allreduce of the momentum; before, the dense gradient average
    n, ranks = run
    check_buckets_started(f"n={n}", ranks, CONFIGS, BUCKETS, STEPS)


def test_overlap_on_and_off_give_bit_identical_parameters_and_state(run) -> None:
    n, ranks = run
    for name in CONFIGS:
        for r, rk in enumerate(ranks):
            on, off = rk["results"][(name, True)], rk["results"][(name, False)]
            for step in range(STEPS):
                stage = "warm-up" if step < FREEZE else "compression"
                for i, (a, b) in enumerate(zip(on["params"][step], off["params"][step], strict=True)):
                    diff = (a - b).abs().max().item()
                    assert torch.equal(a, b), f"n={n} {name} rank {r} step {step + 1} ({stage}) param {i}: {diff:.3g}"
                for i, (a, b) in enumerate(zip(on["params"][step], ranks[0]["results"][(name, True)]["params"][step],
                                               strict=True)):
                    assert torch.equal(a, b), f"n={n} {name} step {step + 1} param {i}: rank {r} differs from rank 0"
            assert len(on["state"]) == len(off["state"])
            for i, (a, b) in enumerate(zip(on["state"], off["state"], strict=True)):
                assert torch.equal(a, b), f"n={n} {name} rank {r}: state tensor {i} differs between overlap on and off"
            assert not torch.equal(on["params"][-1][0], on["params"][FREEZE - 1][0]), f"{name}: compression did not act"


@pytest.mark.parametrize("algo", ["adam", "lamb"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_nan_in_a_late_bucket_on_one_rank_raises_everywhere_with_state_unchanged(run, algo: str, overlap: bool) -> None:
    n, ranks = run
    for r, rk in enumerate(ranks):
        got = rk["nan"][(algo, overlap)]
        assert got["buckets"] == BUCKETS
        assert got["error"].startswith("UsageError:"), f"n={n} {algo} overlap={overlap} rank {r}: {got['error']}"
        assert "non-finite" in got["error"] and "state unchanged" in got["error"], f"rank {r}: {got['error']}"
        if overlap:  # the earlier buckets' compressed allreduce ran (and was undone): the poisoned one is last
            assert got["launched"][-1] >= 1, f"n={n} rank {r}: nothing started during backward"
        assert got["changed"] == [], (
            f"n={n} {algo} overlap={overlap} rank {r}: tensors {got['changed']} of {got['tensors']} (parameters, then "
            "state_dict tensors) changed in the refused step"
        )
        for i, (a, b) in enumerate(zip(got["after_recovery"], ranks[0]["nan"][(algo, overlap)]["after_recovery"],
                                       strict=True)):
            assert torch.equal(a, b), f"n={n}: after the error, rank {r} param {i} differs from rank 0"
        # The refused step left no trace: the runs with and without overlap continue alike.
        for i, (a, b) in enumerate(zip(got["after_recovery"], rk["nan"][(algo, not overlap)]["after_recovery"],
                                       strict=True)):
            assert torch.equal(a, b), f"n={n} {algo} rank {r} param {i}: recovery differs between overlap on and off"


def test_checkpoint_of_another_bucket_layout_is_refused_and_the_old_schema_loads(run) -> None:
    n, ranks = run
    check_checkpoint_layouts(f"n={n}", ranks, "OneBitLamb")


@pytest.mark.parametrize("algo", ["adam", "lamb"])
def test_clipping_between_synchronize_and_step_without_overlap_clips_what_enters_the_momentum(run, algo) -> None:
    """overlap=False: halving ``.grad`` between synchronize() and step() equals halving the loss, bit for bit, in
    warm-up (the averaged gradient) and compression (each rank's own gradient, before its momentum is formed)."""
    n, ranks = run
    for r, rk in enumerate(ranks):
        clipped, halved = rk["clip"][algo]
        for i, (a, b) in enumerate(zip(clipped, halved, strict=True)):
            assert torch.equal(a, b), f"n={n} {algo} rank {r} param {i}: off by {(a - b).abs().max().item():.3g}"
