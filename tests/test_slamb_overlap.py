"""hc.DistributedOptimizer(hc.Lamb(...), op=hc.SLAMB) cuts its parameters into buckets, each a contiguous range of
the flat index space D, whose steps 3 and 4 (the momentum and its masked average under the one global mask M_t,
paper 000 Alg. 1 lines 7, 8 and 10) start while backward runs (overlap=True, the default). Results are bit-identical
to the same calls after backward (overlap=False), through parameter-average steps; the cut does not change the rule
(equal to one bucket per param group); a NaN in any bucket on one rank raises on every rank with every state tensor
unchanged; a checkpoint of another bucket layout loads (SLAMB's state is over all of D), one of other parameters or
another world size is refused, one written before buckets loads, a resumed run continues bit for bit in its own
and in other bucket layouts; without overlap, clipping between synchronize() and step() clips what enters the momentum
(issue 13, item 1)."""

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

STEPS, SYNC = 7, 3  # parameter averages after steps 3 and 6
BUCKETS = 5  # the worker's model cut into 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1]
CONFIGS = ["plain", "accum_groups", "abandoned", "bernoulli_sync_grad"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n{n}")
def run(request, tmp_path_factory) -> tuple[int, list[dict]]:
    """One worker run per rank count serves every test below (each mpirun costs seconds)."""
    n = request.param
    return n, run_worker(tmp_path_factory, "slamb_overlap.py", n, str(STEPS))


def test_buckets_start_during_backward(run) -> None:
    """A bucket's momentum and masked average started from a gradient hook before backward() returned."""
    n, ranks = run
    check_buckets_started(f"n={n}", ranks, CONFIGS, BUCKETS, STEPS)


def test_overlap_on_and_off_give_bit_identical_parameters_and_state(run) -> None:
    n, ranks = run  # every rank alike after the parameter averages only
    check_on_equals_off(f"n={n}", ranks, CONFIGS, STEPS, rank_alike=lambda step: (step + 1) % SYNC == 0)
    for name in CONFIGS:
        for r, rk in enumerate(ranks):
            on = rk["results"][(name, True)]
            assert int(on["state"][-1]) == STEPS, f"n={n} {name} rank {r}: step {int(on['state'][-1])}"


def test_the_cut_into_buckets_does_not_change_the_rule(run) -> None:
    """Five buckets against one bucket per param group: the same masked elements averaged, the same mask. At 2 ranks
    bit for bit (a sum of two is exact in any order); at 3 MPI may sum the elements of a shorter message in another
    order, so the bound is the last bits of float32 (this machine's Open MPI: 0)."""
    n, ranks = run
    for name in CONFIGS:
        for r, rk in enumerate(ranks):
            on, whole = rk["results"][(name, True)], rk["whole"][name]
            assert whole["buckets"] == (2 if "groups" in name or name == "abandoned" else 1)
            for step in range(STEPS):
                for i, (a, b) in enumerate(zip(on["params"][step], whole["params"][step], strict=True)):
                    diff = (a - b).abs().max().item()
                    ok = torch.equal(a, b) if n == 2 else diff <= 1e-6 * max(1.0, b.abs().max().item())
                    assert ok, f"n={n} {name} rank {r} step {step + 1} param {i}: buckets vs whole off by {diff:.3g}"
        assert all(rk["mask_whole"] for rk in ranks), f"n={n}: a bucketed step's mask is not M_t of all D"


@pytest.mark.parametrize("layer", [0, 4], ids=["last_bucket", "first_bucket"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_nan_in_any_bucket_on_one_rank_raises_everywhere_with_state_unchanged(run, overlap: bool, layer: int) -> None:
    n, ranks = run  # the recovery step is the parameter average: every rank alike after it
    check_nan_refused(f"n={n} layer {layer}", ranks, (overlap, layer), (not overlap, layer), overlap, BUCKETS,
                      "parameters, then each parameter's m, step and v, the freshness and the step")
    for r, rk in enumerate(ranks):
        step = rk["nan"][(overlap, layer)]["step"]
        assert step == SYNC, f"n={n} rank {r}: step {step} after the refused step and one more"


def test_checkpoint_of_another_bucket_layout_loads_one_of_other_parameters_is_refused(run) -> None:
    n, ranks = run
    check_checkpoint_layouts(f"n={n}", ranks, "SLAMB", layout_free=True)
    for r, rk in enumerate(ranks):  # written before buckets (no layout at all): SLAMB's state is over D, any cut
        error, equal = rk["old_checkpoint"]
        assert error == "no error" and equal, f"n={n} rank {r}: a pre-bucket checkpoint: {error}, state equal {equal}"


def test_resumed_run_with_buckets_is_bit_identical(run) -> None:
    n, ranks = run
    for r, rk in enumerate(ranks):
        assert rk["resumed"], f"n={n} rank {r}: the run resumed from a checkpoint differs from the one never stopped"


@pytest.mark.parametrize("layout", ["one", "two"])
def test_run_resumed_under_another_bucket_layout_is_bit_identical_to_the_run_never_stopped(run, layout: str) -> None:
    """Saved after 2 steps in five buckets, resumed in one bucket or in two of another split, continued to step 7
    (through the parameter averages of steps 3 and 6): parameters, m, v, step and freshness equal element for
    element to the runs never stopped, in five buckets and in the resumed layout. At 3 ranks too: these masked
    messages are below the ring allreduce's size, where MPI sums each element in an order that does not depend on
    its place in the message."""
    n, ranks = run
    for r, rk in enumerate(ranks):
        got = rk["resumed_layouts"]["layouts"][layout]
        assert got["buckets"] == {"one": 1, "two": 2}[layout], f"n={n} rank {r}: {got['buckets']} buckets"
        for ref, diffs in got["vs"].items():
            for i, (equal, diff) in enumerate(diffs):
                assert equal, (f"n={n} rank {r}: resumed in {layout} vs never stopped in {ref}: tensor {i} "
                               f"(parameters, then m, step, v per parameter, freshness, step) off by {diff:.3g}")


def test_checkpoint_of_another_world_size_is_refused_under_another_layout_with_nothing_changed(run) -> None:
    n, ranks = run
    for r, rk in enumerate(ranks):
        error, unchanged = rk["resumed_layouts"]["other_world"]
        assert error.startswith("ValueError: SLAMB.load_state_dict") and "world_size" in error, f"rank {r}: {error}"
        assert unchanged, f"n={n} rank {r}: the refused checkpoint changed the parameters or state"


def test_clipping_between_synchronize_and_step_without_overlap_clips_what_enters_the_momentum(run) -> None:
    """overlap=False: halving ``.grad`` between synchronize() and step() equals halving the loss, bit for bit (each
    rank's own gradient, before its momentum is formed and averaged)."""
    n, ranks = run
    for r, rk in enumerate(ranks):
        clipped, halved = rk["clip"]
        check_equal(f"n={n} rank {r}: .grad halved vs loss halved", clipped, halved, "param")
