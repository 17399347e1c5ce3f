"""Parameters added or unfrozen after hvd_compress wrapped the optimizer (``add_param_group``, gradual unfreezing):
their gradients would stay each rank's own and the ranks would step apart with no error, so ``step()`` raises
``UsageError`` on every rank with nothing changed; wrapping the optimizer again after the change trains them on
every rank alike (op=Average: as SGD on the exact average of the ranks' gradients). One op per engine: the dense
reductions (Average, PowerSGD), the bucketed 1-bit ops (1-bit Adam, 0/1 Adam) and Adasum; 2 and 3 ranks."""

from __future__ import annotations

import pytest
from mpi_harness import assert_alike_and_near, horovodrun, load_ranks

OPS = ["Average", "PowerSGD", "OneBitAdam", "ZeroOneAdam", "Adasum"]


@pytest.mark.parametrize("n", [2, 3])
def test_parameters_changed_after_wrapping_raise_on_every_rank_and_train_once_wrapped_again(n: int, out_dir) -> None:
    horovodrun("param_groups_change.py", n, out_dir, ",".join(OPS), timeout=240)
    ranks = load_ranks(out_dir, n)
    want = ranks[0]["reference"]
    for op in OPS:
        for how, cause in (("add", "param groups changed"), ("unfreeze", "frozen (requires_grad=False)")):
            for r, rk in enumerate(ranks):
                refused = rk[(op, how, "refused")]
                assert refused["error"] is not None, f"{op} {how} rank {r}: the step after the change was taken"
                assert cause in refused["error"] and "Wrap it again" in refused["error"], refused["error"]
                assert refused["unchanged"], f"{op} {how} rank {r}: the refused step changed the parameters"
            got = [rk[(op, how, "rewrapped")] for rk in ranks]
            assert all(g["error"] is None for g in got), f"{op} {how}: {[g['error'] for g in got]}"
            # op=Average against SGD on the exact average of the ranks' gradients
            assert_alike_and_near(got, ("a", "b"), f"{op} {how} n={n}", want if op == "Average" else None, 1e-6)
            assert got[0]["b_moved"], f"{op} {how}: the layer added or unfrozen did not train"
