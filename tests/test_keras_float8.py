"""Keras 3 float8 training under hck.DistributedOptimizer (op=Average, Sum, Adasum, PowerSGD), 2, 3 and 4 ranks whose
data differ in scale: the scales and amax histories Keras overwrites with their "gradient" (``overwrite_with_gradient``)
become on every rank the largest of the ranks' own values, element by element (the maximum over the half-batches
too with ``backward_passes_per_step=2``, as Keras's own gradient accumulation keeps it): an average would leave the
rank with the largest inputs to saturate them in float8. The other variables step as before (op=Average and Sum
against SGD on the mean and the sum of the ranks' gradients, in NumPy). The optimizer's ``comm_stats()`` counts the
Max allreduce with the rest: all the bytes of ``model.fit``."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_pickled_ranks, mpirun

LR = 0.01


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_float8_scales_and_amax_histories_take_the_largest_rank_value(n: int, out_dir) -> None:
    pytest.importorskip("keras", minversion="3")
    mpirun("keras_float8.py", n, out_dir, timeout=400)
    ranks = load_pickled_ranks(out_dir, n)
    over, paths = ranks[0]["overwritten"], ranks[0]["paths"]
    names = [paths[i] for i in over]
    assert any(p.endswith("amax_history") for p in names) and any(p.endswith("scale") for p in names), names
    runs = [key for key in ranks[0] if isinstance(key, tuple) and key[0] != "bytes"]
    assert len(runs) == 6, runs
    for op, passes in runs:
        for i, path in enumerate(paths):
            # each rank's own values (over its batches), then the largest over the ranks
            own = [np.max([g[i] for g in rk["local"][passes]], axis=0) for rk in ranks]
            grads = [np.sum([g[i] for g in rk["local"][passes]], axis=0) for rk in ranks]
            for r, rk in enumerate(ranks):
                got, where = rk[(op, passes)][i], f"op={op} passes={passes} {path} rank {r} of {n}"
                if i in over:
                    np.testing.assert_array_equal(got, np.max(own, axis=0), err_msg=where)
                    continue
                np.testing.assert_array_equal(got, ranks[0][(op, passes)][i], err_msg=f"{where}: ranks differ")
                if op in ("Average", "Sum"):
                    reduced = np.mean(grads, axis=0) if op == "Average" else np.sum(grads, axis=0)
                    want = rk["start"][i] - LR * reduced
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)
        # opt.comm_stats() counts the Max allreduce too: all the bytes the process sent and received in fit
        for r, rk in enumerate(ranks):
            own, process = rk["bytes", op, passes]
            assert process["bytes_sent"] > 0, f"op={op} passes={passes} rank {r}: nothing sent"
            assert (own["bytes_sent"], own["bytes_received"]) == (process["bytes_sent"], process["bytes_received"]), \
                f"op={op} passes={passes} rank {r}: comm_stats() {own} against the process's {process}"
        # not vacuous: the ranks' own values differ, so an average is not the maximum
        amax = next(i for i in over if paths[i].endswith("inputs_amax_history"))
        own = [rk["local"][passes][0][amax] for rk in ranks]
        assert not np.array_equal(own[0], np.max(own, axis=0)), f"{op}: rank 0 measured the largest amax"
