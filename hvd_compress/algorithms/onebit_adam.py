"""1-bit Adam: paper 003 (Tang et al. 2021), Algorithm 1, over a wrapped Adam/AdamW.

- warm-up (line 2): Adam's step on the averaged gradient, with Adam's bias correction, and weight decay
  as L2 in the gradient (Adam) or decoupled (AdamW: x *= 1 - lr wd); the line says "the original Adam", so its
  operations are those of torch's ``torch.optim.Adam``/``AdamW`` (the single-tensor form, torch's default on the
  CPU) in their order: m by ``lerp_``, v by ``mul_`` then ``addcmul_``, d = sqrt(v) / sqrt(1 - b2^t) + eps,
  x += -lr / (1 - b1^t) * m / d: on the torch face the same bits as the wrapped optimizer's own step;
- compression (lines 5-13): m_r = b1 m + (1 - b1) g_r (line 6, ``OneBitAlgorithm.local_momentum``),
  compressed average (lines 7-11, the core), m = that average (line 12), and
  x = x - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^freeze_step)) + eps) with v frozen (line 13), whose
  denominator is therefore computed once and kept;
- the variance floor's cap (deviates from line 13, with ``variance_floor`` > 0): an element whose frozen vh the
  floor lifted has no measured variance, so its d is raised to |mh| where that is larger: its step is at most lr,
  the step Adam takes on a steady gradient (mh^2 = vh). Without it a unit that revives after warm-up steps
  lr |mh| / sqrt(floor), many times Adam's (figures: docs/algorithms/onebit-adam.md, "Measured fidelity").

On float32 CPU buckets lines 6 and 12-13 each run as one fused pass in the core (``ops.onebit_adam_kernels``)
with the backend path's float32 operations, so both give the same bits; other dtypes and devices take the
backend's ops. The sequencing and the checkpoint schema are ``OneBitAlgorithm``'s (``algorithms/onebit.py``).
"""

from __future__ import annotations

import math
from typing import Any

from hvd_compress.algorithms import contract
from hvd_compress.algorithms.onebit import OneBitAlgorithm, OneBitBucket, OneBitOptions
from hvd_compress.ops import onebit_adam_kernels as fused_ops
from hvd_compress.ops.backend import Tensor
from hvd_compress.ops.constants import AlgorithmOp


class OneBitAdam(OneBitAlgorithm):
    """1-bit Adam on the face's buckets; the group's hyper-parameters are read every step."""

    name = "OneBitAdam"
    options_cls = OneBitOptions
    op = AlgorithmOp("OneBitAdam", 16)
    buffers = "onebit"
    wraps = contract.ADAM

    @staticmethod
    def decoupled(group: dict[str, Any]) -> bool:
        return bool(group.get("decoupled_weight_decay", False))

    def l2_in_gradient(self, group: dict[str, Any]) -> bool:
        return not self.decoupled(group)  # Adam's weight decay is g + wd x; AdamW's is decoupled

    def warmup(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        """Adam's step on the averaged gradient (003 Alg. 1 line 2), with Adam's L2 term g + wd x."""
        xp = self.xp
        b1, b2 = group["betas"]
        g = seg.grad
        if group["weight_decay"] != 0 and not self.decoupled(group):
            g = xp.copy_(seg.scratch, seg.grad)
            self.add_l2(g, seg, group, group["weight_decay"])
        xp.lerp_(seg.exp_avg, g, 1 - b1)  # m + (1 - b1) (g - m): torch's Adam's own rounding (docstring above)
        xp.addcmul_(xp.mul_(seg.exp_avg_sq, b2), g, g, value=1 - b2)
        self.apply(seg, group, t, t)

    def compressed(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        """m = the compressed average (in ``work``; 003 Alg. 1 line 12), then line 13 with v frozen at freeze_step.

        On float32 CPU buffers (both faces' usual case) this is the core's one fused pass (``_compressed_fused``,
        the same float32 operations, bit for bit); other dtypes and devices take the backend's ops here."""
        denom = self.frozen_denom(seg, group, self.freeze_step)
        if fused_ops.accepts(seg.work, seg.exp_avg, denom, *(p for p, n in zip(seg.params, seg.sizes, strict=True)
                                                               if n)):
            self._compressed_fused(seg, group, t, denom)
            return
        self.xp.copy_(seg.exp_avg, seg.work)
        self.apply(seg, group, t, self.freeze_step)

    def _compressed_fused(self, seg: OneBitBucket, group: dict[str, Any], t: int, denom: Tensor) -> None:
        """Lines 12-13 in the core's one pass: m = work; x *= 1 - lr wd (AdamW); x -= lr / (1 - b1^t) * m / denom,
        with ``apply``'s scalars."""
        b1 = group["betas"][0]
        lr, wd = group["lr"], group["weight_decay"]
        decay = 1 - lr * wd if wd != 0 and self.decoupled(group) else 1.0
        fused_ops.apply_(seg.params, seg.work, seg.exp_avg, denom, seg.sizes, decay, -lr / (1 - b1**t),
                         seg.floor_denoms, self.cap(group, t))

    def denom_buffer(self, seg: OneBitBucket) -> Tensor:
        return seg.scratch  # free in the compressed stage: the L2 gradient copy is a warm-up thing

    def adopt_denom(self, seg: OneBitBucket, denom: Tensor) -> None:
        seg.scratch = denom

    def apply(self, seg: OneBitBucket, group: dict[str, Any], t_m: int, t_v: int) -> None:
        """x = x - lr / (1 - b1^t_m) * m / (sqrt(v) / sqrt(1 - b2^t_v) + eps), as torch.optim.Adam."""
        xp = self.xp
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd != 0 and self.decoupled(group):
            xp.foreach_mul_(seg.params, 1 - lr * wd)
        if t_v < t_m:  # v frozen: the denominator is the same every step, computed once and kept
            denoms = self.capped(seg, self.frozen_denom(seg, group, t_v), self.cap(group, t_m))
        else:
            denom = xp.add_(xp.div_(xp.sqrt(seg.exp_avg_sq, out=seg.scratch), math.sqrt(1 - b2**t_v)), group["eps"])
            seg.denom_key = None
            denoms = seg.views(denom)
        xp.foreach_addcdiv_(seg.params, seg.views(seg.exp_avg), denoms, value=-lr / (1 - b1**t_m))
