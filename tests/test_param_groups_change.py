"""Parameters added, unfrozen or frozen after hvd_compress wrapped the optimizer (``add_param_group``, gradual
unfreezing, freezing a layer mid-run): an added or unfrozen one's gradients would stay each rank's own and the ranks
would step apart with no error, and a frozen one would be stepped on a zero gradient (Adam's momentum moves it,
where torch's optimizer leaves a parameter without a gradient), so ``step()`` raises ``UsageError`` on every rank
with nothing changed; wrapping the optimizer again after the change trains them on every rank alike (op=Average: as
SGD on the exact average of the ranks' gradients) and leaves a frozen one as it was (``zero_grad()`` clears the
gradient it kept from before the freeze, as torch's does, so the wrapped optimizer does not step it on that). Adasum
steps each parameter as its gradient lands, so it leaves a frozen one alone without wrapping again. One op per
engine: the dense reductions (Average, PowerSGD), the bucketed 1-bit ops (1-bit Adam, 0/1 Adam) and Adasum; 2 and 3
ranks."""

from __future__ import annotations

import pytest
from mpi_harness import assert_alike_and_near, load_ranks, mpirun

OPS = ["Average", "PowerSGD", "OneBitAdam", "ZeroOneAdam", "Adasum"]


CAUSES = {"add": "param groups changed", "unfreeze": "frozen (requires_grad=False) when it was built",
          "freeze": "are frozen (requires_grad=False) now"}


@pytest.mark.parametrize("n", [2, 3])
def test_parameters_changed_after_wrapping_raise_on_every_rank_and_train_once_wrapped_again(n: int, out_dir) -> None:
    mpirun("param_groups_change.py", n, out_dir, ",".join(OPS), timeout=300)
    ranks = load_ranks(out_dir, n)
    for op in OPS:
        for how, cause in CAUSES.items():
            want = ranks[0][("reference", how)]
            # Adasum: a frozen parameter gets no local step, so it is left as torch leaves it, wrapped again or not
            kept = op == "Adasum" and how == "freeze"
            if not kept:
                for r, rk in enumerate(ranks):
                    refused = rk[(op, how, "refused")]
                    assert refused["error"] is not None, f"{op} {how} rank {r}: the step after the change was taken"
                    assert cause in refused["error"] and "Wrap it again" in refused["error"], refused["error"]
                    assert refused["unchanged"], f"{op} {how} rank {r}: the refused step changed the parameters"
            for run in ("refused", "rewrapped") if kept else ("rewrapped",):
                got = [rk[(op, how, run)] for rk in ranks]
                assert all(g["error"] is None for g in got), f"{op} {how} {run}: {[g['error'] for g in got]}"
                # op=Average against SGD on the exact average of the ranks' gradients
                assert_alike_and_near(got, ("a", "b"), f"{op} {how} {run} n={n}", want if op == "Average" else None,
                                      1e-6)
                # b trains once added or unfrozen, and a frozen b stays as it was frozen (as torch's optimizer
                # leaves a parameter without a gradient)
                assert got[0]["b_moved"] == (how != "freeze"), f"{op} {how} {run}: b moved {got[0]['b_moved']}"
