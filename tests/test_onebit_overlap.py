"""hc.DistributedOptimizer(op=OneBitAdam/OneBitLamb) cuts its parameters into buckets (buckets, each with its own
error feedback) and reduces them while backward runs (overlap=True, the default): dense gradient averages in
warm-up, the local momentum through the 1-bit compressed allreduce after. Results are bit-identical to reducing the
same buckets after backward (overlap=False); a NaN in a late bucket on one rank raises on every rank with every
state tensor unchanged; a checkpoint of another bucket layout is refused (issue 13, item 1)."""

from __future__ import annotations

import pytest
import torch
from overlap_checks import (
    check_buckets_started,
    check_checkpoint_layouts,
    check_equal,
    check_nan_refused,
    check_on_equals_off,
    run_worker,
)

STEPS, FREEZE = 7, 3  # 3 dense warm-up steps, then 4 compressed ones
BUCKETS = 5  # the worker's model cut into 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1]
CONFIGS = ["adam", "lamb", "adam_accum_groups", "lamb_accum", "lamb_abandoned"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n{n}")
def run(request, tmp_path_factory) -> tuple[int, list[dict]]:
    """One worker run per rank count serves every test below (each mpirun costs seconds)."""
    n = request.param
    return n, run_worker(tmp_path_factory, "onebit_overlap.py", n, str(STEPS), str(FREEZE))


def test_buckets_start_during_backward_in_warmup_and_compression(run) -> None:
    # steps > FREEZE: the compressed allreduce of the momentum; before, the dense gradient average
    n, ranks = run
    check_buckets_started(f"n={n}", ranks, CONFIGS, BUCKETS, STEPS)


def test_overlap_on_and_off_give_bit_identical_parameters_and_state(run) -> None:
    n, ranks = run
    check_on_equals_off(f"n={n}", ranks, CONFIGS, STEPS,
                        stage=lambda step: " (warm-up)" if step < FREEZE else " (compression)")
    for name in CONFIGS:
        for rk in ranks:
            on = rk["results"][(name, True)]
            assert not torch.equal(on["params"][-1][0], on["params"][FREEZE - 1][0]), f"{name}: compression did not act"


@pytest.mark.parametrize("algo", ["adam", "lamb"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_nan_in_a_late_bucket_on_one_rank_raises_everywhere_with_state_unchanged(run, algo: str, overlap: bool) -> None:
    # with overlap the earlier buckets' compressed allreduce ran (and was undone): the poisoned one is last
    n, ranks = run
    check_nan_refused(f"n={n} {algo}", ranks, (algo, overlap), (algo, not overlap), overlap, BUCKETS,
                      "parameters, then state_dict tensors")


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
        check_equal(f"n={n} {algo} rank {r}: .grad halved vs loss halved", clipped, halved, "param")
