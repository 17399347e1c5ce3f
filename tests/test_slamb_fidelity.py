"""SLAMB fidelity (issue 9 item 7), 4 ranks: with k = 0.1 the final held-out loss is within 2% of dense
hc.Lamb's (or better) on the teacher task (tests/workers/teacher_task.py) and on a ReLU CNN trained on real data
(scikit-learn's digits, tests/workers/relu_fidelity.py ``cnn``), with the ranks' parameters identical after the final
``synchronize_parameters()``.

Measured (4 ranks, batch 16 per rank, cosine decay to 0, final held-out loss), SLAMB with the variance floor
(hvd_compress.algorithms.slamb, step 7: a rank's local v of an element whose local gradient was 0, under an
averaged m, gave u = m / eps; the paper's rule is +23.4% on the teacher task and +21.4% on the MLP at 200 steps):

| task                                          | steps | hc.Lamb | SLAMB k=0.1, H=100 |
| teacher task, 2 epochs x 32 steps (shard 1024)|    64 | 0.3089  | 0.3148 (+1.9%)     |
| digits ReLU CNN                               |   200 | 0.1587  | 0.1896 (+19.5%)    |
| digits ReLU CNN                               |   400 | 0.0487  | 0.0478 (-1.8%)     |
| digits ReLU CNN                               |   600 | 0.0413  | 0.0356 (-13.8%)    |
| digits ReLU CNN                               |   800 | 0.0495  | 0.0370 (-25.3%)    |
| synthetic ReLU MLP (teacher labels)           |   200 | 1.1593  | 1.3004 (+12.2%)    |
| synthetic ReLU MLP                            |   600 | 0.9385  | 0.9634 (+2.7%)     |
| synthetic ReLU MLP                            |  1500 | 0.7851  | 0.9129 (+16.3%)    |

The CNN test runs 400 steps: at 200 steps (two parameter averages) neither run has settled, from 400 on SLAMB
is level or better (its ranks' local steps act as a regulariser where dense Lamb overfits the 1297 images).

OPEN on the synthetic MLP: the 2% target is NOT met there, at any horizon tried (figures above). The
implementation matches the spec's rule element by element (tests/test_slamb.py), so the gap is the rule's: each
rank steps on its own batch-16 gradient (no gradient allreduce, spec S6), 90% of the momentum is local at any
step, stale elements move at lr / sqrt(n), and the models are averaged only every 100 steps; on a shard of 2048
teacher-labelled samples per rank the local models drift to their shard. Kept as a strict xfail so that it turns
into a failure the day it passes (then drop the mark), not hidden.

Where the MLP's gap comes from (2026-11-25, 200 steps, held-out loss; hc.Lamb 1.1587 in that run): k = 1, H = 1
(every momentum element averaged, parameters averaged every step, v local) 1.2030 (+3.8%); k = 1, H = 100 1.2318
(+6.3%); k = 0.1, H = 1 1.1618 (+0.3%); k = 0.1 with H = 5 / 10 / 25 / 50 / 100: 1.2381 / 1.2573 / 1.2991 / 1.2871 /
1.2975 (+6.9 / +8.5 / +12.1 / +11.1 / +12.0%). So the masking itself costs nothing here once the parameters are
averaged every step; the gap is the ranks' drift between parameter averages, already +6.9% at H = 5, which is the
rule's (no gradient average, spec S6), not a choice of k. Alg. 1's line 9 (``sync_grad``: g[M] averaged too)
does not close it: k = 0.1, H = 100 with it 1.2887 (+11.2%); k = 1, H = 100 with it 1.1801 (+1.8%).
"""

from __future__ import annotations

import math

import pytest
from mpi_harness import load_ranks, mpirun, relu_fidelity_runs

pytestmark = pytest.mark.long  # the long tier (make test-long): docs/design.md, "Test tiers"

N = 4


def _check(task: str, dense: float, slamb: float) -> None:
    assert math.isfinite(dense), f"{task}: hc.Lamb did not train"
    rel = slamb / dense - 1
    print(f"{task}: hc.Lamb {dense:.4f}  SLAMB k=0.1 {slamb:.4f}  ({100 * rel:+.2f}%)")
    assert rel <= 0.02, f"{task}: SLAMB final held-out loss {slamb:.4f} is {100 * rel:+.2f}% off hc.Lamb's {dense:.4f}"


OPEN = pytest.mark.xfail(strict=True, reason="open: SLAMB k=0.1 is ~12% off hc.Lamb on the ReLU MLP at 200 steps")


def test_slamb_on_demo_task_within_two_percent_of_lamb(out_dir) -> None:
    mpirun("slamb_demo_fidelity.py", N, out_dir, "2", "1024", timeout=300)
    ranks = load_ranks(out_dir, N)
    res = ranks[0]
    _check("demo", res["Lamb"]["final_loss"], res["SLAMB"]["final_loss"])
    assert all(rk["SLAMB"]["final_loss"] == res["SLAMB"]["final_loss"] for rk in ranks), "ranks' models differ"
    ratio = res["Lamb"]["mb_sent"] / res["SLAMB"]["mb_sent"]
    print(f"demo: bytes sent in the last epoch, Lamb / SLAMB = {ratio:.2f}")
    assert ratio > 2, f"SLAMB sent {res['SLAMB']['mb_sent']} MB, Lamb {res['Lamb']['mb_sent']} MB"


def test_slamb_on_digits_relu_cnn_within_two_percent_of_lamb(out_dir) -> None:
    _relu_run(out_dir, "cnn", 400)


@OPEN
def test_slamb_on_relu_mlp_within_two_percent_of_lamb(out_dir) -> None:
    _relu_run(out_dir, "mlp", 200)


def _relu_run(out_dir, task: str, steps: int) -> None:
    res = relu_fidelity_runs(out_dir, N, task, steps, ["Lamb", "SLAMB:0.1:100"])
    assert res["SLAMB:0.1:100"]["error"] is None, res["SLAMB:0.1:100"]["error"]
    _check(f"relu {task}", res["Lamb"]["test_loss"], res["SLAMB:0.1:100"]["test_loss"])
