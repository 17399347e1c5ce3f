"""hc.DistributedOptimizer(op=hc.Birder) cuts its parameters into buckets (buckets, each with its own m, b and
error feedback, and its own Philox key) whose core call starts while backward runs (overlap=True, the default).
Results are bit-identical to the same calls after backward (overlap=False); a NaN in a late bucket on one rank
raises on every rank with every state tensor, the step (the RNG position) and the parameters unchanged; a
checkpoint of another bucket layout is refused (issue 13, item 1). Flat at 2 and 3 ranks, hierarchical at 4 ranks
with HVDC_LOCAL_SIZE=2 (2 nodes of 2)."""

from __future__ import annotations

import pytest
from overlap_checks import (
    check_buckets_started,
    check_checkpoint_layouts,
    check_nan_refused,
    check_on_equals_off,
    run_worker,
)

STEPS = 4
BUCKETS = 5  # the worker's model cut into 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1]
CONFIGS = ["plain", "accum_groups", "abandoned"]


@pytest.fixture(scope="module", params=[(2, 0), (3, 0), (4, 2)], ids=["n2", "n3", "2x2"])
def run(request, tmp_path_factory) -> tuple[str, list[dict]]:
    """One worker run per world serves every test below (each mpirun costs seconds)."""
    n, local = request.param
    env = {"HVDC_LOCAL_SIZE": str(local)} if local else {}
    return f"n={n} local={local}", run_worker(tmp_path_factory, "birder_overlap.py", n, str(STEPS),
                                              "1" if local else "0", env=env)


def test_buckets_start_during_backward(run) -> None:
    where, ranks = run
    check_buckets_started(where, ranks, CONFIGS, BUCKETS, STEPS)


def test_overlap_on_and_off_give_bit_identical_parameters_and_state(run) -> None:
    where, ranks = run
    check_on_equals_off(where, ranks, CONFIGS, STEPS)
    for name in CONFIGS:
        for r, rk in enumerate(ranks):
            on = rk["results"][(name, True)]
            assert len(on["state"]) == 1 + 4 * BUCKETS, f"{where} {name} rank {r}: {len(on['state'])} state tensors"
            assert int(on["state"][0]) == STEPS, f"{where} {name} rank {r}: step {int(on['state'][0])}"


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_nan_in_a_late_bucket_on_one_rank_raises_everywhere_with_state_unchanged(run, overlap: bool) -> None:
    # with overlap the earlier buckets' core calls ran (and were undone): the poisoned one is last
    where, ranks = run
    check_nan_refused(where, ranks, overlap, not overlap, overlap, BUCKETS,
                      "parameters, then the step and each bucket's m, b, worker and server error")
    for r, rk in enumerate(ranks):
        step = rk["nan"][overlap]["step"]
        assert step == 3, f"{where} rank {r}: step {step} after the refused step and one more"


def test_checkpoint_of_another_bucket_layout_is_refused_and_the_old_schema_loads(run) -> None:
    where, ranks = run
    check_checkpoint_layouts(where, ranks, "Birder")


def test_two_buckets_draw_from_their_own_streams(run) -> None:
    """Two equal buckets with r = 0 everywhere: u = Q(0) is a fair coin per element; with one key for both buckets
    the two parameters would move alike (spec 4: draws are keyed by element index within the call)."""
    where, ranks = run
    for r, rk in enumerate(ranks):
        assert rk["streams_differ"], f"{where} rank {r}: two buckets drew the same uniforms"
