"""The two-stage machine that 1-bit Adam (``onebit_adam``) and 1-bit LAMB (``onebit_lamb``) share.

Paper 003 Algorithm 1 and paper 001 Algorithm 1 have the same skeleton, written here once:

- warm-up, steps 1..``freeze_step`` (line 2 of both boxes): the gradients are averaged densely
  (``synchronize``) and the uncompressed rule runs on the average;
- compression, later steps (lines 5-13 of 003, 6-13 of 001): the variance stays frozen, each rank forms
  m_r = b1 m + (1 - b1) g_r from the shared momentum and its own gradient (line 6), the m_r go through the
  error-compensated 1-bit compressed allreduce (lines 7-11/13, in the core), and every rank applies the
  same update with the result.

Variance floor, option ``variance_floor`` (both optimizers; deviates from 003 line 13 and 001 lines 17
and 21): in the compressed stage each layer's frozen vh is used as max(vh, variance_floor * mean(vh)),
the mean over that layer (parameter tensor) of the frozen vh; 1-bit LAMB floors its fresh vh by the
same per-layer value in the ratio of line 17, so that the ratio still compares two estimates of one
second moment. ``variance_floor=0`` is the papers' exact rule; the default is 0.01. Why: the compressor
gives every element of a chunk +/-the chunk's scale, so an element whose frozen v is 0 (a ReLU unit
dead through warm-up) gets m = +/-scale and an update lr scale / eps: with eps 1e-8 parameters jump
from 0.07 to 25 in one step, then turn non-finite (DeepSpeed's OnebitAdam/OnebitLamb share this). A
unit that revives later, with v still 0, does the same. With the floor such an element is
preconditioned like a quiet element of its layer. Compressing m / (sqrt(vh) + eps) instead of m
bounds the dead elements' step but not a revived one's (it still diverged on a ReLU MLP and CNN) and
trained worse with the floor added (tests/test_relu_fidelity.py's module docstring has the figures).
The floor is derived from the frozen v in the state, so checkpoints need nothing more.

Hierarchical mode, option ``hierarchical=True`` (paper 004 Section 4, specs/birder.md section 4): the local
momenta travel through the Hierarchical-1-bit-All-Reduce with the scaled 1-bit payload: a full-precision
mean within each node, then the 1-bit compressed allreduce among the ranks with the same local index (one
per node), then a gather within the node. The worker error then covers this rank's chunk of its node's
mean (dpad / ranks per node entries), the server error dpad / world size; both are in ``state_dict()``.

Non-finite values: a NaN/Inf gradient on any rank makes ``step()`` raise ``UsageError`` on every rank
before any state changes (warm-up: checked on the averaged gradient, which every rank holds; compression:
one tiny flag allreduce when there are several segments, then the core checks what enters each
compressor on every rank). Nothing is skipped silently.

Overlap with backward (issue 13): not done, because per-bucket calls cannot give today's results. ``op=Average``
starts bucket allreduces from the gradient hooks (``hvd_compress.ops.buckets``); doing the same here, the local
momentum of a bucket (line 6, element-wise) could be formed in its hook, but its compressed allreduce could not:

- the compressor's scale is ||x||_2 / sqrt(C) over each of the n server chunks of the whole padded segment
  (chunk j = elements [jC, (j+1)C) of P = onebit_padded_numel(numel, n), served by rank j). A bucket is a tail of
  the segment (reverse registration order), so its own call would cut different chunks, with other scales: other
  update values, not just another summation order;
- the server error has P / n entries per segment and the worker error is written per chunk; per-bucket calls
  change these shapes, so checkpoints of the two paths would not load into each other;
- warm-up and the compression stage both decide per step and per segment (finite agreement before any error
  buffer changes, ``agree_finite``); a bucket reduced before the last gradient exists would commit its error
  feedback before a later NaN could reject the step;
- in the compression stage ``.grad`` holds each rank's own gradient between ``synchronize()`` and ``step()`` so
  that clipping it clips what enters the momentum; a momentum formed in the hook would skip that clipping.

What would be needed for identical results: a core collective split into a per-chunk phase 1 (compress chunk j
and send its block to rank j as soon as every gradient in [jC, (j+1)C) is final, non-blocking sends instead of the
one alltoall) and a final phase (server average, allgather, decompress) started by ``step()``; error buffers
written only in the final phase (so a rejection still leaves them unchanged) and the finite check moved there;
and clipping documented as unavailable with overlap. Chunks are 1/n of the segment, so the overlap would be
coarse at small n. The warm-up's dense gradient average could reuse the Average buckets, at the price of a
summation order that differs from today's single call at 3 or more ranks.

State: one ``Segment`` per (param group, dtype) of flat buffers that the face allocates (its framework's
tensors, of which each parameter's state is a view), the step, and per segment the 1-bit error feedback
and LAMB's per-layer coefficients. ``state_dict()`` is the one checkpoint schema every face writes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from hvd_compress import ops
from hvd_compress.algorithms.agreement import nonfinite_everywhere
from hvd_compress.algorithms.options import build_options
from hvd_compress.ops import birder as birder_ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.onebit import compressed_allreduce_
from hvd_compress.ops.traffic import CommMeter

DEFAULT_VARIANCE_FLOOR = 0.01


@dataclasses.dataclass(frozen=True)
class OneBitOptions:
    """Options of both 1-bit optimizers: ``freeze_step`` dense warm-up steps (required), ``variance_floor``."""

    freeze_step: int
    variance_floor: float = DEFAULT_VARIANCE_FLOOR
    hierarchical: bool = False

    def validate(self, op_name: str) -> None:
        fs = self.freeze_step
        if isinstance(fs, bool) or not isinstance(fs, int) or fs < 1:
            raise ValueError(f"{op_name}: freeze_step must be an int >= 1, got {fs!r}")
        floor = self.variance_floor
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < math.inf:
            raise ValueError(
                f"op={op_name}: variance_floor must be a finite number >= 0 (0: the papers' exact rule; default "
                f"{DEFAULT_VARIANCE_FLOOR}), got {floor!r}"
            )
        if not isinstance(self.hierarchical, bool):
            raise ValueError(f"op={op_name}: hierarchical must be True or False, got {self.hierarchical!r}")


def parse_options(options_cls: type, op_name: str, given: dict[str, Any]) -> Any:
    """``options_cls`` built from ``DistributedOptimizer``'s keyword options, with clear errors."""
    if "freeze_step" not in given:
        raise TypeError(f"op={op_name} needs freeze_step=<number of dense warm-up steps>")
    return build_options(options_cls, op_name, given)


@dataclasses.dataclass
class Segment:
    """The parameters of one (param group, dtype) with the face's flat buffers for them.

    ``grad``, ``exp_avg``, ``exp_avg_sq`` (and LAMB's ``fresh``) have the parameters' dtype; ``work`` and
    ``scratch`` are float32 whatever that dtype is, so that m_r is formed and compressed without losing
    bits to a half type. ``onebit`` is the face's error-feedback state (``state_dict``/``load_state_dict``/
    ``check_state_dict``/``reset`` and ``worker_error``/``server_error`` buffers). ``views(flat)`` gives the
    per-parameter views of one of these buffers.
    """

    group: int
    params: list[Tensor]
    sizes: list[int]  # elements of each parameter
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    fresh: Tensor | None
    work: Tensor
    scratch: Tensor
    onebit: Any
    views: Callable[[Tensor], list[Tensor]]
    # The algorithm's own per-segment state:
    denom: Tensor | None = None  # d = sqrt(vh_frozen) + eps, kept while v is frozen
    denom_key: tuple[float, ...] | None = None  # the (eps, b2, t_v) that ``denom`` holds d for
    floor_roots: list[float] = dataclasses.field(default_factory=list)  # per layer sqrt(floor), with the kept d
    lamb_coeff_freeze: list[float] = dataclasses.field(default_factory=list)
    last_factor: list[float] = dataclasses.field(default_factory=list)
    # (worker, server) error of the hierarchical mode, made on first use (sizes depend on the node size).
    hierarchical_errors: tuple[Tensor, Tensor] | None = None

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def __post_init__(self) -> None:
        self.lamb_coeff_freeze = self.lamb_coeff_freeze or [0.0] * len(self.params)
        self.last_factor = self.last_factor or [1.0] * len(self.params)


class OneBitAlgorithm:
    """The shared sequencing; subclasses supply ``warmup``, ``compressed`` and ``denom_buffer``."""

    name = "OneBit"
    options_cls: type = OneBitOptions
    # True where a checkpoint without our section cannot be resumed past warm-up (state would be lost).
    needs_section_after_warmup = False
    has_fresh_variance = False  # segments need a ``fresh`` buffer (1-bit LAMB)

    def __init__(
        self, options: OneBitOptions, backend: Backend, segments: Sequence[Segment], meter: CommMeter | None
    ) -> None:
        self.options = options
        self.xp = backend
        self.segments = list(segments)
        self.meter = meter if meter is not None else CommMeter()
        self.t = 0  # steps taken

    @property
    def freeze_step(self) -> int:
        return self.options.freeze_step

    @property
    def compression_started(self) -> bool:
        return self.t >= self.freeze_step

    # -- the step ------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """The gradient phase of the coming step: warm-up averages ``grad`` over all ranks; the
        compression stage never averages a gradient (the momentum travels in ``step``)."""
        if self.t + 1 <= self.freeze_step:
            for i, seg in enumerate(self.segments):
                self.meter.run(ops.allreduce_, seg.grad, op=ReduceOp.Average, name=f"{self.name}.grad.{i}")

    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """One optimizer step on the segments' (synchronized) gradients; returns the new step count."""
        t = self.t + 1
        if t <= self.freeze_step:
            self.check_finite()
            for seg in self.segments:
                self.warmup(seg, groups[seg.group], t)
        else:
            for seg in self.segments:
                self.local_momentum(seg, groups[seg.group])
            if len(self.segments) > 1:
                self.agree_finite()
            for i, seg in enumerate(self.segments):
                if self.options.hierarchical:
                    werr, serr = self.hierarchical_errors(seg)
                    self.meter.run(
                        birder_ops.hierarchical_compressed_allreduce_, seg.work, werr, serr,
                        payload=birder_ops.PAYLOAD_SCALED, hierarchical=True, name=f"{self.name}.m.{i}",
                    )
                    continue
                self.meter.run(
                    compressed_allreduce_, seg.work, seg.onebit.worker_error, seg.onebit.server_error,
                    name=f"{self.name}.m.{i}",
                )
            for seg in self.segments:
                self.compressed(seg, groups[seg.group], t)
        self.t = t
        return t

    def hierarchical_errors(self, seg: Segment) -> tuple[Tensor, Tensor]:
        """The segment's (worker, server) error of the hierarchical mode, zeros when first asked for."""
        if seg.hierarchical_errors is None:
            c1, c2 = birder_ops.state_numels(seg.numel, True)
            seg.hierarchical_errors = (self.xp.float32_like(c1, seg.work), self.xp.float32_like(c2, seg.work))
        return seg.hierarchical_errors

    def check_finite(self) -> None:
        # Every rank holds the same averaged gradients, so every rank reaches the same verdict.
        for seg in self.segments:
            bad = self.xp.first_nonfinite(seg.grad)
            if bad is not None:
                raise UsageError(
                    f"{self.name}: non-finite averaged gradient at step {self.t + 1} (element {bad[0]} of param "
                    f"group {seg.group}: value {bad[1]}); step not taken, state unchanged"
                )

    def agree_finite(self) -> None:
        bad = nonfinite_everywhere(self.xp, [seg.work for seg in self.segments], self.meter, self.name)
        if bad > 0:
            raise UsageError(
                f"{self.name}: non-finite local momentum at step {self.t + 1} on {bad} segment(s) over all "
                "ranks (NaN/Inf gradient); step not taken, state unchanged"
            )

    # -- the math both boxes share -------------------------------------------------------------------
    def local_momentum(self, seg: Segment, group: dict[str, Any]) -> None:
        """work = b1 m + (1 - b1) g_r (003 Alg. 1 line 6; 001 Alg. 1 line 6), this rank's gradient."""
        xp = self.xp
        b1 = group["betas"][0]
        # Copy first: a product written straight into float32 would be rounded to a half gradient's dtype.
        xp.mul_(xp.copy_(seg.work, seg.grad), 1 - b1)
        self.add_l2(seg.work, seg, group, (1 - b1) * group["weight_decay"])
        xp.add_(seg.work, seg.exp_avg, alpha=b1)

    def add_l2(self, flat: Tensor, seg: Segment, group: dict[str, Any], alpha: float) -> None:
        """Adds alpha * x to ``flat`` where the rule has an L2 term in the gradient (Adam's weight decay)."""

    def frozen_denom(self, seg: Segment, group: dict[str, Any], t_v: int) -> Tensor:
        """d = max(sqrt(vh), sqrt(floor)) + eps per layer for the frozen v of step ``t_v`` (see the top:
        variance floor): v does not change after freeze_step, so d is computed once (per eps, b2) into
        ``denom_buffer(seg)``; bias-corrected unless the group turns that off."""
        xp = self.xp
        b2 = group["betas"][1]
        key = (float(group["eps"]), float(b2), float(t_v))
        out = self.denom_buffer(seg)
        if seg.denom_key != key:
            bc = 1 - b2**t_v if group.get("bias_correction", True) else 1.0
            xp.sqrt(seg.exp_avg_sq, out=out)
            if bc != 1.0:
                xp.div_(out, math.sqrt(bc))
            ratio = self.options.variance_floor
            means = xp.foreach_mean(seg.views(seg.exp_avg_sq))
            sizes = zip(means, seg.sizes, strict=True)
            seg.floor_roots = [math.sqrt(ratio * mean / bc) if size else 0.0 for mean, size in sizes]
            self.floor(seg, out)
            xp.add_(out, group["eps"])
            seg.denom_key = key
        return out

    def floor(self, seg: Segment, root: Tensor) -> None:
        """root = max(root, sqrt(floor)) per layer, with the floors of the kept frozen denominator."""
        if self.options.variance_floor > 0:
            for view, floor in zip(seg.views(root), seg.floor_roots, strict=True):
                self.xp.clamp_min_(view, floor)

    def denom_buffer(self, seg: Segment) -> Tensor:
        raise NotImplementedError

    def warmup(self, seg: Segment, group: dict[str, Any], t: int) -> None:
        raise NotImplementedError

    def compressed(self, seg: Segment, group: dict[str, Any], t: int) -> None:
        raise NotImplementedError

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The one checkpoint schema of the 1-bit optimizers (the section ``hvd_compress`` of a face's)."""
        return {
            "algorithm": self.name,
            "step": self.t,
            "freeze_step": self.freeze_step,
            "segments": [
                {
                    "numel": seg.numel,
                    "onebit": seg.onebit.state_dict(),
                    "lamb_coeff_freeze": list(seg.lamb_coeff_freeze),
                    "last_factor": list(seg.last_factor),
                    **self.hierarchical_state(seg),
                }
                for seg in self.segments
            ],
            "hierarchical": self.options.hierarchical,
        }

    def hierarchical_state(self, seg: Segment) -> dict[str, Any]:
        if not self.options.hierarchical:
            return {}
        xp = self.xp
        werr, serr = self.hierarchical_errors(seg)
        return {"hierarchical_errors": [xp.copy_(xp.zeros_like(werr), werr), xp.copy_(xp.zeros_like(serr), serr)]}

    def check_state_dict(self, ours: dict[str, Any]) -> None:
        """Raise a clear ValueError, before anything changes, if ``ours`` cannot be loaded here."""
        what = f"{self.name}.load_state_dict"
        if ours.get("algorithm") != self.name:
            raise ValueError(f"{what}: the checkpoint is for {ours.get('algorithm')!r}")
        if bool(ours.get("hierarchical", False)) != self.options.hierarchical:
            raise ValueError(f"{what}: checkpoint hierarchical={ours.get('hierarchical', False)} != "
                             f"{self.options.hierarchical}")
        if ours.get("freeze_step") != self.freeze_step:
            raise ValueError(f"{what}: checkpoint freeze_step {ours.get('freeze_step')} != {self.freeze_step}")
        saved = ours.get("segments", [])
        want = [seg.numel for seg in self.segments]
        if [s.get("numel") for s in saved] != want:
            raise ValueError(f"{what}: fused buffer sizes {[s.get('numel') for s in saved]} != this model's {want}")
        for seg, s in zip(self.segments, saved, strict=True):
            if len(s["lamb_coeff_freeze"]) != len(seg.params) or len(s["last_factor"]) != len(seg.params):
                raise ValueError(f"{what}: per-layer coefficients do not match the parameters")
            seg.onebit.check_state_dict(s["onebit"])
            if self.options.hierarchical:
                got = [self.xp.describe(e) for e in s.get("hierarchical_errors", [None, None])]
                want = [self.xp.describe(e) for e in self.hierarchical_errors(seg)]
                if got != want:
                    raise ValueError(f"{what}: hierarchical errors {got} != {want} (another world or node size?)")

    def load_state_dict(self, ours: dict[str, Any] | None, plain_step: int) -> None:
        """Restore ``state_dict()``; ``None`` (a plain optimizer's checkpoint at step ``plain_step``) starts the
        error feedback from zero. Call ``check_state_dict``/``check_plain_step`` first."""
        if ours is None:
            for seg in self.segments:
                seg.onebit.reset()
                if self.options.hierarchical:
                    for e in self.hierarchical_errors(seg):
                        self.xp.zero_(e)
            self.t = plain_step
        else:
            self.t = int(ours["step"])
            for seg, saved in zip(self.segments, ours["segments"], strict=True):
                seg.onebit.load_state_dict(saved["onebit"])
                seg.lamb_coeff_freeze = [float(c) for c in saved["lamb_coeff_freeze"]]
                seg.last_factor = [float(c) for c in saved["last_factor"]]
                if self.options.hierarchical:
                    for target, value in zip(self.hierarchical_errors(seg), saved["hierarchical_errors"], strict=True):
                        self.xp.copy_(target, value)
        for seg in self.segments:
            seg.denom_key = None

    def check_plain_step(self, t: int, key: str) -> None:
        """A checkpoint without our section (a plain optimizer's, at step ``t``) is refused where the missing
        state matters: 1-bit LAMB past its warm-up (its averaged trust ratios are lost)."""
        if t > self.freeze_step and self.needs_section_after_warmup:
            raise ValueError(
                f"{self.name}: the optimizer state (step {t}) has no '{key}' section, "
                f"which is needed after freeze_step={self.freeze_step}"
            )
