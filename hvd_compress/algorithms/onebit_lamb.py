"""1-bit LAMB: paper 001 (Li et al. 2022), Algorithm 1, over a wrapped LAMB (``algorithms.lamb``).

Per layer (= parameter tensor):

- warm-up (line 2): dense LAMB on the averaged gradient; c_avg = coeff_beta c_avg + (1 - coeff_beta) c, c
  the trust ratio;
- at the end of ``freeze_step`` (line 3): v is frozen, a fresh copy keeps updating, c_avg stops;
- compression (lines 6-21): the fused momentum goes through the compressed allreduce (lines 7-13);
  g_rec = (m - b1 m_prev) / (1 - b1) (line 15); v_fresh = b2 v_fresh + (1 - b2) g_rec^2 (line 16);
  r = max over the layer of (sqrt(vh) + eps) / (sqrt(vh_fresh) + eps) (line 17, garbled in the text:
  DeepSpeed's form; vh, vh_fresh bias-corrected for freeze_step and t when the group has
  ``bias_correction``); r clipped to (1 -/+ factor_threshold) r_prev (line 18), then to
  [factor_min, factor_max] (line 19; DeepSpeed's reverse order gives the same r while 1 is in that range);
  x = x - lr r c_avg (mh / (sqrt(vh) + eps) + wd x) (lines 20-21).
The sequencing and the checkpoint schema are ``OneBitAlgorithm``'s (``algorithms/onebit.py``). The box line by
line against this code, where DeepSpeed differs, and the rule's own gap to LAMB: docs/algorithms/onebit-lamb.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hvd_compress.algorithms import contract
from hvd_compress.algorithms.lamb import trust_ratio
from hvd_compress.algorithms.onebit import OneBitAlgorithm, OneBitBucket, OneBitOptions
from hvd_compress.ops import onebit_lamb_kernels as fused_ops
from hvd_compress.ops.backend import Tensor
from hvd_compress.ops.constants import AlgorithmOp


@dataclasses.dataclass(frozen=True)
class OneBitLambOptions(OneBitOptions):
    """1-bit LAMB's options, with the paper's defaults (001 Section 6)."""

    coeff_beta: float = 0.9
    factor_min: float = 0.5
    factor_max: float = 4.0
    factor_threshold: float = 0.1

    def validate(self, op_name: str) -> None:
        super().validate(op_name)
        if not 0 < self.factor_min <= self.factor_max:
            raise ValueError(
                f"op={op_name}: need 0 < factor_min <= factor_max, got {self.factor_min}, {self.factor_max}"
            )
        if not 0 <= self.factor_threshold < 1:
            raise ValueError(f"op={op_name}: factor_threshold must be in [0, 1), got {self.factor_threshold}")
        if not 0 <= self.coeff_beta < 1:
            raise ValueError(f"op={op_name}: coeff_beta must be in [0, 1), got {self.coeff_beta}")


class OneBitLamb(OneBitAlgorithm):
    """1-bit LAMB on the face's buckets (each with a ``fresh`` variance buffer)."""

    name = "OneBitLamb"
    options_cls = OneBitLambOptions
    op = AlgorithmOp("OneBitLamb", 17)
    buffers = "onebit"
    wraps = contract.LAMB
    needs_section_after_warmup = True
    has_fresh_variance = True
    options: OneBitLambOptions

    def warmup(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        """LAMB on the averaged gradient, averaging the trust ratios (001 Alg. 1 lines 2-3)."""
        xp = self.xp
        b1, b2 = group["betas"]
        g = seg.grad
        xp.add_(xp.mul_(seg.exp_avg, b1), g, alpha=1 - b1)
        xp.addcmul_(xp.mul_(seg.exp_avg_sq, b2), g, g, value=1 - b2)
        if t == self.freeze_step:  # line 3: the fresh variance starts from the frozen one
            xp.copy_(seg.fresh, seg.exp_avg_sq)
        u = self.direction(seg, group, t, t)
        beta3 = self.options.coeff_beta
        scales = []
        for i, (xn, un) in enumerate(zip(xp.foreach_norm(seg.params), xp.foreach_norm(u), strict=True)):
            c = trust_ratio(xn, un, group["min_coeff"], group["max_coeff"])
            seg.lamb_coeff_freeze[i] = beta3 * seg.lamb_coeff_freeze[i] + (1 - beta3) * c
            scales.append(-group["lr"] * c)
        xp.foreach_mul_(u, scales)
        xp.foreach_add_(seg.params, u, alpha=1.0)

    def compressed(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        """Lines 14-21: reconstructed gradient, fresh variance, clipped ratio, update with frozen v.

        On float32 CPU buffers (both faces' usual case) the element-wise part runs in the core's two fused passes
        (``_compressed_fused``, same float32 operations); other dtypes and devices take the backend's ops here."""
        frozen = self.frozen_denom(seg, group, self.freeze_step)
        if fused_ops.accepts(seg.work, seg.exp_avg, seg.fresh, frozen, *(p for p, n in zip(seg.params, seg.sizes,
                                                                                             strict=True) if n)):
            self._compressed_fused(seg, group, t, frozen)
            return
        xp = self.xp
        b1, b2 = group["betas"]
        g_rec = xp.div_(xp.sub(seg.work, seg.exp_avg, alpha=b1, out=seg.scratch), 1 - b1)
        xp.addcmul_(xp.mul_(seg.fresh, b2), g_rec, g_rec, value=1 - b2)
        xp.copy_(seg.exp_avg, seg.work)
        fresh = xp.sqrt(seg.fresh, out=seg.scratch)
        if group.get("bias_correction", True):
            xp.div_(fresh, math.sqrt(1 - b2**t))
        self.floor(seg, fresh)  # the frozen variance's floor: line 17 compares like with like
        ratio = xp.div(frozen, xp.add_(fresh, group["eps"]), out=seg.scratch)
        scales = self._clipped_scales(seg, group, [xp.max(view) if seg.sizes[i] else 1.0
                                                   for i, view in enumerate(seg.views(ratio))])
        u = xp.div(seg.exp_avg, self.capped_flat(seg, frozen, self.cap(group, t)), out=seg.work)
        if group.get("bias_correction", True):
            xp.div_(u, 1 - b1**t)
        views = seg.views(u)
        if group["weight_decay"] != 0:
            xp.foreach_add_(views, seg.params, alpha=group["weight_decay"])
        xp.foreach_mul_(views, scales)
        xp.foreach_add_(seg.params, views, alpha=1.0)

    def _compressed_fused(self, seg: OneBitBucket, group: dict[str, Any], t: int, frozen: Tensor) -> None:
        """``compressed`` in the core's two passes: lines 14-17 (g_rec, fresh v, m = the averaged momentum and each
        layer's max ratio) in one, the clipping of lines 18-19 here, lines 20-21 in the other."""
        b1, b2 = group["betas"]
        bias = group.get("bias_correction", True)
        floors = seg.floor_roots if self.options.variance_floor > 0 else [0.0] * len(seg.sizes)
        ratios = fused_ops.moments_(seg.work, seg.exp_avg, seg.fresh, frozen, seg.sizes, floors, b1, b2,
                                    1 - b2**t if bias else 1.0, group["eps"])
        scales = self._clipped_scales(seg, group, ratios)
        fused_ops.apply_(seg.params, seg.exp_avg, self.capped_flat(seg, frozen, self.cap(group, t)), seg.sizes,
                         1 - b1**t if bias else 1.0, group["weight_decay"], scales)

    def capped_flat(self, seg: OneBitBucket, frozen: Tensor, cap: float) -> Tensor:
        """The frozen d with the variance floor's cap (``capped``), as one flat buffer: ``work`` where the floor
        lifted some element (m has left ``work`` by then), else ``frozen`` itself."""
        if seg.floor_denoms is None:
            return frozen
        self.capped(seg, frozen, cap)
        return seg.work

    def _clipped_scales(self, seg: OneBitBucket, group: dict[str, Any], ratios: list[float]) -> list[float]:
        """Lines 18-19: each layer's ratio clipped to (1 -/+ factor_threshold) of the last, then to [factor_min,
        factor_max] (kept as the new last); returns the layers' step scales -lr r c_avg (lines 20-21)."""
        opt = self.options
        scales = []
        for i, ratio in enumerate(ratios):
            prev = seg.last_factor[i]
            r = min(max(ratio, (1 - opt.factor_threshold) * prev), (1 + opt.factor_threshold) * prev)
            r = min(max(r, opt.factor_min), opt.factor_max)
            seg.last_factor[i] = r
            scales.append(-group["lr"] * r * seg.lamb_coeff_freeze[i])
        return scales

    def denom_buffer(self, seg: OneBitBucket) -> Tensor:
        # Its own buffer (``scratch`` holds the reconstructed gradient and the ratio), made when first needed.
        if seg.denom is None:
            seg.denom = self.xp.float32_like(seg.numel, seg.exp_avg)
        return seg.denom

    def adopt_denom(self, seg: OneBitBucket, denom: Tensor) -> None:
        seg.denom = denom

    def direction(self, seg: OneBitBucket, group: dict[str, Any], t_m: int, t_v: int) -> list[Tensor]:
        """u = mh / (sqrt(vh) + eps) + wd x per layer, in ``work`` (views)."""
        xp = self.xp
        b1, b2, eps = *group["betas"], group["eps"]
        u = seg.work
        if group.get("bias_correction", True):
            xp.add_(xp.div_(xp.sqrt(seg.exp_avg_sq, out=u), math.sqrt(1 - b2**t_v)), eps)
            xp.div_(xp.mul_(xp.reciprocal_(u), seg.exp_avg), 1 - b1**t_m)
        else:
            xp.mul_(xp.reciprocal_(xp.add_(xp.sqrt(seg.exp_avg_sq, out=u), eps)), seg.exp_avg)
        views = seg.views(u)
        if group["weight_decay"] != 0:
            xp.foreach_add_(views, seg.params, alpha=group["weight_decay"])
        return views
