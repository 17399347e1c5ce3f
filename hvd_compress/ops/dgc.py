"""Deep Gradient Compression's local gradient clipping and sparsity warm-up (Lin et al., "Deep Gradient
Compression", ICLR 2018, Sections 3.2 and 3.3), with a dense start, the one definition both faces' top-k uses
(through ``hvd_compress.ops.compression``). Momentum correction and momentum factor masking live in the core's
top-k pass.
"""

from __future__ import annotations

import math


def warmup_ratio(ratio: float, warmup_steps: int, stages: int, step: int, dense_steps: int = 0) -> float:
    """The density top-k sends at ``step`` (calls completed): 1 for the first ``dense_steps`` calls; then over
    ``warmup_steps`` calls it ramps down exponentially in ``stages`` equal stages, ``ratio ** ((e + 1) /
    (stages + 1))`` in stage e, then ``ratio``.

    Lin et al. Section 3.3 ("exponentially increase the gradient sparsity ... 75%, 93.75%, 98.4375%, 99.6%,
    99.9%" over the first four epochs); the coefficient is the official DGC code's (``warmup_coeff =
    ratio ** (1 / (warmup_epochs + 1))``), which gives the paper's 25%, 6.25%, ... for ratio 0.001 and 4 stages.
    The dense start is torch's ``start_powerSGD_iter`` for top-k: plain reductions while the model changes
    fastest (the core sends a density of 1, or any density where the ranks' selections could cover the buffer,
    as a dense reduction). A pure function of the step, so every rank agrees and a resumed run continues on the
    same ratio."""
    if step < dense_steps:
        return 1.0
    step -= dense_steps
    if warmup_steps <= 0 or step >= warmup_steps:
        return ratio
    stage = step * stages // warmup_steps
    return max(ratio, ratio ** ((stage + 1) / (stages + 1)))


def local_clip_scale(norm: float, clip_norm: float, size: int) -> float:
    """The factor that clips one rank's gradient of 2-norm ``norm`` before it enters the accumulation: the global
    threshold ``clip_norm`` scaled by ``size ** -0.5`` (Lin et al. Section 3.2, "Local Gradient Clipping": each
    rank's share of the threshold if all ranks had identical gradient distributions). 1.0 when under it, and
    for a non-finite norm (the reduction then rejects the gradient on every rank)."""
    threshold = clip_norm / math.sqrt(size)
    if not math.isfinite(norm) or norm <= threshold:
        return 1.0
    return threshold / norm
