"""Birder fidelity (issue 10 item 5), 4 ranks: the 1-bit algorithm (op=hc.Birder) against its uncompressed rule
(hc.Birder behind op=hc.Average, "BirderDense") and against dense Adam, final held-out loss.

Measured (4 ranks on 2 loaded cores, same lr for Birder and its rule, cosine decay):

| task                                                 | rule    | Birder flat       | Birder 2x2 hier. | Adam   |
| teacher task (teacher_task.py), 4 epochs, shard 4096 | 0.2797  | 0.2823 (+0.92%)   |                  | 0.2802 |
| teacher task, 2 epochs, shard 2048                   | 0.2901  | 0.2956 (+1.92%)   |                  | 0.2893 |
| relu mlp (relu_fidelity.py), 200 steps, lr 1e-3      | 1.3647  | 1.4187 (+3.96%)   | 1.4103 (+3.3%)   | 1.3659 |
| relu mlp, 600 steps (2026-11-25)                     | 1.0017  | 1.2464 (+24.4%)   |                  | 0.9399 |
| relu mlp, 1000 steps (2026-11-25)                    | 0.9582  | 1.0200 (+6.4%)    |                  | 0.8235 |
| relu cnn (digits), 150 steps, lr 1e-3                | 0.3527  | 0.6845 (+94%)     | 0.4734 (+34%)    |        |
| relu cnn, 600 steps                                  | 0.0765  | 0.1059 (+38%)     |                  |        |

OPEN on the ReLU networks: the 2% target is NOT met. No bug found: the optimizer equals a NumPy transcription
of Alg. 1 (per-worker m, b from the worker's gradient, r = m / (b + eps), worker and server error feedback,
x -= lr u) exactly for 8 steps, flat and 2 nodes x 2, with the core's Philox draws
(tests/test_birder_optimizer.py::test_optimizer_equals_algorithm_1_element_by_element), and the collective
equals hvd_compress.reference.birder bit for bit (tests/test_birder.py, cpp/tests/test_hierarchical.cc). The gap is
the rule's at these horizons: every element moves by exactly +/-lr every step, where the rule moves lr * |m / b|,
which is small for noisy elements; error feedback bounds the accumulated difference by 4 lr per element, not the
training noise it injects. On the CNN the relative gap shrinks with steps (+94% at 150, +38% at 600); on the MLP it
does not settle (+4% / +24% / +6% at 200 / 600 / 1000 steps), so a longer run is no way out. Kept as a
strict xfail so that it turns into a failure the day it passes (then drop the mark), not hidden.

Where the gap comes from (2026-11-25): the rule behind op=hc.Average takes m / b of the AVERAGED gradient, while
Alg. 1 averages the workers' ratios m_i / b_i of their own gradients (lines 5-8) before any bit is sent. The
worker's ``BirderExact`` (``ExactMeanBirder``) is Alg. 1 with its quantization left out: each rank steps hc.Birder's
rule on its own gradient and the parameters are then averaged exactly, i.e. x -= lr mean(m_i / (b_i + eps)). It
splits the gap into the rule's part and the compression's own:

| task, steps (lr 1e-3)   | rule (avg. gradient) | Alg. 1, exact mean | Birder (1-bit)  | Birder vs exact mean |
| relu mlp 200            | 1.3647               | 1.4029 (+2.8%)     | 1.4187 (+4.0%)  | +1.1%                |
| relu mlp 600            | 1.0017               | 1.0613 (+6.0%)     | 1.2552 (+25%)   | +18%                 |
| relu cnn 150            | 0.3527               | 0.6503 (+84%)      | 0.6845 (+94%)   | +5.3%                |
| relu cnn 600            | 0.0765               | 0.1090 (+42%)      | 0.1059 (+38%)   | -2.8%                |

So on the CNN nearly all of the gap to the rule is Alg. 1's own (ratios per worker), which no implementation of
the paper's algorithm avoids, and the 1-bit exchange is level with lossless communication at 600 steps. On the MLP
at 200 steps, lr 5e-4 and 2e-3 (a one-process torch simulation of the 4 workers, which reproduced the rule's
1.3647 and the exact mean's 1.4029 at lr 1e-3), the quantization cost +0.4% and +7.7% over the exact mean. Over the
quantizer's seeds 0-4 (``Birder:<seed>``), Birder against the exact mean is +1.0 to +1.1% on the MLP at 200 steps
and -5.8 to +0.8% on the CNN at 600. Pinned below: Birder within 2% of the exact mean on the MLP at 200 steps and
on the CNN at 600; the MLP at 600 steps, where the compression itself costs +18%, is a strict xfail.
"""

from __future__ import annotations

import math

import pytest
from mpi_harness import load_ranks, mpirun, relu_fidelity_runs

pytestmark = pytest.mark.long  # the long tier (make test-long): docs/design.md, "Test tiers"

N = 4


def _check(task: str, name: str, got: float, want: float, bound: float) -> None:
    assert math.isfinite(want), f"{task}: {name} did not train"
    rel = got / want - 1
    print(f"{task}: Birder {got:.4f} vs {name} {want:.4f} ({100 * rel:+.2f}%)")
    assert rel <= bound, f"{task}: Birder's final held-out loss {got:.4f} is {100 * rel:+.2f}% off {name}'s {want:.4f}"


def test_birder_on_demo_task_within_two_percent_of_its_rule_and_five_of_adam(out_dir) -> None:
    mpirun("slamb_demo_fidelity.py", N, out_dir, "4", "4096", "BirderDense,Birder,Adam", timeout=300)
    ranks = load_ranks(out_dir, N)
    res = ranks[0]
    assert all(rk["Birder"]["final_loss"] == res["Birder"]["final_loss"] for rk in ranks), "ranks' models differ"
    _check("demo", "its uncompressed rule", res["Birder"]["final_loss"], res["BirderDense"]["final_loss"], 0.02)
    _check("demo", "Adam", res["Birder"]["final_loss"], res["Adam"]["final_loss"], 0.05)
    # 1 bit per element against 32; on this 6.5k-parameter model the per-call signatures and the step's agreement
    # on edited gradients (with overlap) add to the bits: 14.4x in all
    ratio = res["BirderDense"]["mb_sent"] / res["Birder"]["mb_sent"]
    assert ratio > 14, f"Birder sent {res['Birder']['mb_sent']} MB, its dense rule {res['BirderDense']['mb_sent']} MB"


@pytest.mark.xfail(strict=True, reason="open: Birder is ~4% off its rule on the ReLU MLP at 200 steps")
def test_birder_on_relu_mlp_within_two_percent_of_its_rule(out_dir) -> None:
    res = relu_fidelity_runs(out_dir, N, "mlp", 200, ["BirderDense", "Birder"])
    assert res["Birder"]["error"] is None, res["Birder"]["error"]
    _check("relu mlp", "its uncompressed rule", res["Birder"]["test_loss"], res["BirderDense"]["test_loss"], 0.02)


def _against_exact_mean(out_dir, task: str, steps: int) -> None:
    res = relu_fidelity_runs(out_dir, N, task, steps, ["BirderExact", "Birder"])
    assert res["Birder"]["error"] is None, res["Birder"]["error"]
    _check(f"relu {task} {steps}", "Alg. 1 without quantization (exact mean of the workers' m/b)",
           res["Birder"]["test_loss"], res["BirderExact"]["test_loss"], 0.02)


def test_birder_on_relu_mlp_within_two_percent_of_its_algorithm_without_quantization(out_dir) -> None:
    _against_exact_mean(out_dir, "mlp", 200)


def test_birder_on_relu_cnn_within_two_percent_of_its_algorithm_without_quantization(out_dir) -> None:
    _against_exact_mean(out_dir, "cnn", 600)


@pytest.mark.xfail(strict=True, reason="open: on the ReLU MLP at 600 steps the 1-bit exchange itself costs ~18%")
def test_birder_on_long_relu_mlp_within_two_percent_of_its_algorithm_without_quantization(out_dir) -> None:
    _against_exact_mean(out_dir, "mlp", 600)
