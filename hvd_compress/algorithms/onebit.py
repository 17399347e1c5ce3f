"""The two-stage machine that 1-bit Adam (``onebit_adam``) and 1-bit LAMB (``onebit_lamb``) share.

Paper 003 Algorithm 1 and paper 001 Algorithm 1 have the same skeleton, written here once:

- warm-up, steps 1..``freeze_step`` (line 2 of both boxes): the gradients are averaged densely
  (``synchronize``) and the uncompressed rule runs on the average;
- compression, later steps (lines 5-13 of 003, 6-13 of 001): the variance stays frozen, each rank forms
  m_r = b1 m + (1 - b1) g_r from the shared momentum and its own gradient (line 6), the m_r go through the
  error-compensated 1-bit compressed allreduce (lines 7-11/13, in the core), and every rank applies the
  same update with the result.

Deviation, ``variance_floor`` (003 line 13, 001 lines 17 and 21; 0 is the papers' rule): the frozen vh is used
as max(vh, variance_floor * max(mean(vh) over the layer, ``BUCKET_SHARE`` * mean(vh) over its bucket)), and an
element the floor lifted steps at most lr (``caps_floored``). Invariants: one ``OneBitBucket`` per bucket, each with
its own error feedback; overlap on and off make the same calls; a bucket refused on any rank leaves every state
as it was. Why, buckets, overlap, checkpoints: docs/algorithms/onebit-adam.md, "How the algorithm runs".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from hvd_compress import ops
from hvd_compress.algorithms.bucketed import BucketedAlgorithm
from hvd_compress.ops import hierarchical_onebit
from hvd_compress.ops import onebit_adam_kernels as momentum_ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.onebit import compressed_allreduce_, server_error_numel
from hvd_compress.ops.traffic import CommMeter

DEFAULT_VARIANCE_FLOOR = 0.01
#: A layer's floor is variance_floor times the larger of its own mean vh and this share of its bucket's mean vh.
BUCKET_SHARE = 0.01


def floor_roots(xp: Backend, v_views: Sequence[Tensor], sizes: Sequence[int], ratio: float,
                bc: float = 1.0) -> list[float]:
    """Per layer sqrt(ratio * max(mean v over the layer, ``BUCKET_SHARE`` * mean v over the bucket) / bc): the least
    root of v an element of the layer steps with under the variance floor (0 for an empty layer)."""
    means = xp.foreach_mean(v_views)
    bucket = BUCKET_SHARE * sum(m * n for m, n in zip(means, sizes, strict=True)) / max(sum(sizes), 1)
    return [math.sqrt(ratio * max(mean, bucket) / bc) if n else 0.0 for mean, n in zip(means, sizes, strict=True)]


def floor_denoms(xp: Backend, roots: Sequence[float], like: Tensor, eps: float) -> list[float]:
    """Each layer's d = sqrt(floor) + eps as a floored denominator rounds it (the same backend ops on one element), so
    that ``d <= floor_denoms[i]`` finds exactly the elements the floor lifted."""
    one = xp.float32_like(1, like)
    out = []
    for floor in roots:
        xp.zero_(one)
        out.append(xp.max(xp.add_(xp.clamp_min_(one, floor), eps)))
    return out


def capped_views(xp: Backend, views: Callable[[Tensor], list[Tensor]], denom: Tensor, m: Tensor, out: Tensor,
                 cap: float, denoms: Sequence[float] | None, sizes: Sequence[int]) -> list[Tensor]:
    """Per layer ``denom`` where the floor did not lift it, else max(d, |m| cap), in ``out`` (``denoms`` from
    ``floor_denoms``; None: no floor, ``denom``'s views as they are)."""
    if denoms is None:
        return views(denom)
    return [xp.raise_floored(d, mi, cap, floor, out=o) if n else d
            for d, mi, o, floor, n in zip(views(denom), views(m), views(out), denoms, sizes, strict=True)]


@dataclasses.dataclass(frozen=True)
class OneBitOptions:
    """Options of both 1-bit optimizers: ``freeze_step`` dense warm-up steps (required), ``variance_floor``."""

    #: What ``parse_options``'s error for a missing required option asks for.
    REQUIRED: ClassVar[dict[str, str]] = {"freeze_step": "<number of dense warm-up steps>"}

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


@dataclasses.dataclass
class OneBitBucket:
    """The parameters of one bucket (of one param group and dtype) with the face's flat buffers for them.

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
    # The algorithm's own per-bucket state:
    denom: Tensor | None = None  # d = sqrt(vh_frozen) + eps, kept while v is frozen
    denom_key: tuple[float, ...] | None = None  # the (eps, b2, t_v) that ``denom`` holds d for
    floor_roots: list[float] = dataclasses.field(default_factory=list)  # per layer sqrt(floor), with the kept d
    floor_denoms: list[float] | None = None  # per layer the d of an element the floor lifted (None: no floor)
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


class OneBitAlgorithm(BucketedAlgorithm):
    """The shared sequencing; subclasses supply ``warmup``, ``compressed`` and ``denom_buffer``. The buckets'
    pipeline, backups and layout check are ``BucketedAlgorithm``'s."""

    name = "OneBit"
    options_cls: type = OneBitOptions
    # True where a checkpoint without our section cannot be resumed past warm-up (state would be lost).
    needs_section_after_warmup = False
    has_fresh_variance = False  # buckets need a ``fresh`` buffer (1-bit LAMB)

    def __init__(
        self, options: OneBitOptions, backend: Backend, buckets: Sequence[OneBitBucket], meter: CommMeter | None
    ) -> None:
        self.options = options
        self.xp = backend
        self.buckets = list(buckets)
        self.meter = meter if meter is not None else CommMeter()
        self.t = 0  # steps taken
        self._init_buckets()

    @property
    def freeze_step(self) -> int:
        return self.options.freeze_step

    @property
    def compression_started(self) -> bool:
        return self.t >= self.freeze_step

    # -- the buckets of a step ---------------------------------------------------------------------------
    def rejection_is_the_step(self, t: int) -> bool:
        # warm-up: the dense average of a NaN is refused in ``step`` (check_finite) with its own message
        return t > self.freeze_step

    def mutable_state(self, seg: OneBitBucket) -> tuple[Tensor, Tensor]:
        """The error feedback the bucket's compressed allreduce updates (lines 9 and 11 of 003 Alg. 1)."""
        return self._errors(seg)

    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i``'s collective for step ``t`` (on the background thread): warm-up, the dense average of its
        gradients (line 2); compression, its local momentum (line 6) through the compressed allreduce (lines
        7-13), its error feedback copied aside first."""
        seg = self.buckets[i]
        warm = t <= self.freeze_step
        name = self.call_name(f"{self.name}.grad.{i}" if warm else f"{self.name}.m.{i}", i, groups)
        with failure_joins_as_rejection(self.meter, name):
            if warm:
                self.meter.run(ops.allreduce_, seg.grad, op=ReduceOp.Average, name=name)
                return
            if groups is None:
                raise ValueError(f"{self.name}: the compression stage needs the param groups")
            self.local_momentum(seg, groups[seg.group])
            errors = self._errors(seg)
            self.backup(i)  # a later bucket may still fail: keep a way back
        if self.options.hierarchical:
            self.meter.run(
                hierarchical_onebit.hierarchical_compressed_allreduce_, seg.work, *errors,
                payload=hierarchical_onebit.PAYLOAD_SCALED, hierarchical=True, name=name,
            )
        else:
            self.meter.run(compressed_allreduce_, seg.work, *errors, name=name)

    def _errors(self, seg: OneBitBucket) -> tuple[Tensor, Tensor]:
        """The (worker, server) error feedback the bucket's compressed allreduce updates."""
        if self.options.hierarchical:
            return self.hierarchical_errors(seg)
        return seg.onebit.worker_error, seg.onebit.server_error

    # -- the step ------------------------------------------------------------------------------------
    def synchronize(self, groups: Sequence[dict[str, Any]] | None = None) -> None:
        """The gradient phase of the coming step. Warm-up averages ``grad`` over all ranks (every bucket);
        the compression stage never averages a gradient: with overlap it finishes the buckets' compressed
        allreduce started from the hooks, without it leaves all to ``step`` (after any clipping of ``.grad``)."""
        if self.t + 1 <= self.freeze_step:
            if not self._done:
                self.reduce_all(groups)
        else:
            BucketedAlgorithm.synchronize(self, groups)

    def consumes_gradients_in_synchronize(self) -> bool:
        # warm-up averages the gradients in place: an edit after it acts on the average, as with Horovod
        return self.overlap and self.t + 1 > self.freeze_step

    def writes_gradients(self) -> bool:
        return self.overlap and self.t + 1 <= self.freeze_step

    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """One optimizer step on the reduced buckets (reducing those not reduced yet); returns the new
        step count. Nothing changes if any bucket fails on any rank."""
        t = self.t + 1
        self.reduce_pending(groups)  # every bucket succeeded: this step's error feedback stands
        if t <= self.freeze_step:
            self.check_finite()
            for seg in self.buckets:
                self.warmup(seg, groups[seg.group], t)
        else:
            for seg in self.buckets:
                self.compressed(seg, groups[seg.group], t)
        self.t = t
        return t

    def error_numels(self, numel: int, world_size: int) -> tuple[int, int]:
        """Elements of the (worker, server) error feedback of a bucket of ``numel`` elements that its compressed
        allreduce uses: the hierarchical pair (``hierarchical_errors``), else its elements and the padded chunk
        this rank serves (``OneBitState``'s)."""
        if self.options.hierarchical:
            return hierarchical_onebit.state_numels(numel, True)
        return numel, server_error_numel(numel, world_size)

    def hierarchical_errors(self, seg: OneBitBucket) -> tuple[Tensor, Tensor]:
        """The bucket's (worker, server) error of the hierarchical mode, zeros when first asked for."""
        if seg.hierarchical_errors is None:
            c1, c2 = hierarchical_onebit.state_numels(seg.numel, True)
            seg.hierarchical_errors = (self.xp.float32_like(c1, seg.work), self.xp.float32_like(c2, seg.work))
        return seg.hierarchical_errors

    def check_finite(self) -> None:
        # Every rank holds the same averaged gradients, so every rank reaches the same verdict.
        for seg in self.buckets:
            bad = self.xp.first_nonfinite(seg.grad)
            if bad is not None:
                raise UsageError(
                    f"{self.name}: non-finite averaged gradient at step {self.t + 1} (element {bad[0]} of param "
                    f"group {seg.group}: value {bad[1]}); step not taken, state unchanged"
                )

    # -- the math both boxes share -------------------------------------------------------------------
    def local_momentum(self, seg: OneBitBucket, group: dict[str, Any]) -> None:
        """work = b1 m + (1 - b1) g_r (003 Alg. 1 line 6; 001 Alg. 1 line 6), this rank's gradient, plus Adam's L2
        term (1 - b1) wd x where the rule has one (``l2_in_gradient``).

        On float32 CPU buffers this is the core's one fused pass (``ops.onebit_adam_kernels``, the same float32
        operations); other dtypes and devices take the backend's ops here."""
        xp = self.xp
        b1 = group["betas"][0]
        alpha = (1 - b1) * group["weight_decay"]
        l2 = alpha != 0 and self.l2_in_gradient(group)
        layers = [p for p, n in zip(seg.params, seg.sizes, strict=True) if n] if l2 else []
        if momentum_ops.accepts(seg.work, seg.grad, seg.exp_avg, *layers):
            momentum_ops.local_momentum_(seg.work, seg.grad, seg.exp_avg, b1, alpha if l2 else None, seg.params,
                                         seg.sizes)
            return
        # Copy first: a product written straight into float32 would be rounded to a half gradient's dtype.
        xp.mul_(xp.copy_(seg.work, seg.grad), 1 - b1)
        self.add_l2(seg.work, seg, group, alpha)
        xp.add_(seg.work, seg.exp_avg, alpha=b1)

    def l2_in_gradient(self, group: dict[str, Any]) -> bool:
        """Whether the rule adds its weight decay to the gradient as an L2 term (Adam's; not AdamW's, not LAMB's)."""
        return False

    def add_l2(self, flat: Tensor, seg: OneBitBucket, group: dict[str, Any], alpha: float) -> None:
        """Adds alpha * x to ``flat`` where the rule has an L2 term in the gradient (``l2_in_gradient``)."""
        if alpha != 0 and self.l2_in_gradient(group):
            self.xp.foreach_add_(seg.views(flat), seg.params, alpha=alpha)

    def frozen_denom(self, seg: OneBitBucket, group: dict[str, Any], t_v: int) -> Tensor:
        """d = max(sqrt(vh), sqrt(floor)) + eps per layer for the frozen v of step ``t_v`` (see the top:
        variance floor, and its bucket share): v does not change after freeze_step, so d is computed once (per
        eps, b2) into ``denom_buffer(seg)``; bias-corrected unless the group turns that off."""
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
            seg.floor_roots = floor_roots(xp, seg.views(seg.exp_avg_sq), seg.sizes, ratio, bc)
            self.floor(seg, out)
            xp.add_(out, group["eps"])
            capped = ratio > 0 and self.caps_floored
            seg.floor_denoms = self._floor_denoms(seg, out, group["eps"]) if capped else None
            seg.denom_key = key
        return out

    def _floor_denoms(self, seg: OneBitBucket, like: Tensor, eps: float) -> list[float]:
        return floor_denoms(self.xp, seg.floor_roots, like, eps)

    def floor(self, seg: OneBitBucket, root: Tensor) -> None:
        """root = max(root, sqrt(floor)) per layer, with the floors of the kept frozen denominator."""
        if self.options.variance_floor > 0:
            for view, floor in zip(seg.views(root), seg.floor_roots, strict=True):
                self.xp.clamp_min_(view, floor)

    #: Whether the update caps the step of the elements the variance floor lifted (needs ``OneBitBucket.floor_denoms``).
    caps_floored = True

    @staticmethod
    def cap(group: dict[str, Any], t: int) -> float:
        """1 / (1 - b1^t): |m| times it is |mh|, the least d that keeps a floored element's |mh / d| <= 1."""
        return 1 / (1 - group["betas"][0] ** t) if group.get("bias_correction", True) else 1.0

    def capped(self, seg: OneBitBucket, denom: Tensor, cap: float) -> list[Tensor]:
        """The frozen ``denom`` per layer with the variance floor's cap (see the top): where the floor lifted d, d =
        max(d, |m| cap), in ``work`` (free once m was copied out of it); the kept ``denom`` is not changed."""
        return capped_views(self.xp, seg.views, denom, seg.exp_avg, seg.work, cap, seg.floor_denoms, seg.sizes)

    def denom_buffer(self, seg: OneBitBucket) -> Tensor:
        raise NotImplementedError

    def adopt_denom(self, seg: OneBitBucket, denom: Tensor) -> None:
        """Make ``denom`` (what ``denom_buffer`` gave for an earlier bucket over the same frozen v) this bucket's
        denominator buffer: a face that rebuilds its bucket every step keeps d instead of recomputing it; the
        caller sets ``denom_key`` and the floors with it."""
        raise NotImplementedError

    def warmup(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        raise NotImplementedError

    def compressed(self, seg: OneBitBucket, group: dict[str, Any], t: int) -> None:
        raise NotImplementedError

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The one checkpoint schema of the 1-bit optimizers (the section ``hvd_compress`` of a face's)."""
        return {
            "algorithm": self.name,
            "step": self.t,
            "freeze_step": self.freeze_step,
            "buckets": [
                {
                    **self.layout_state(seg),
                    "onebit": seg.onebit.state_dict(),
                    "lamb_coeff_freeze": list(seg.lamb_coeff_freeze),
                    "last_factor": list(seg.last_factor),
                    **self.hierarchical_state(seg),
                }
                for seg in self.buckets
            ],
            "hierarchical": self.options.hierarchical,
        }

    def hierarchical_state(self, seg: OneBitBucket) -> dict[str, Any]:
        if not self.options.hierarchical:
            return {}
        xp = self.xp
        werr, serr = self.hierarchical_errors(seg)
        return {"hierarchical_errors": [xp.copy_(xp.zeros_like(werr), werr), xp.copy_(xp.zeros_like(serr), serr)]}

    def check_state_dict(self, ours: dict[str, Any]) -> None:
        """Raise a clear ValueError, before anything changes, if ``ours`` cannot be loaded here."""
        what = f"{self.name}.load_state_dict"
        self.check_owner(ours)
        if bool(ours.get("hierarchical", False)) != self.options.hierarchical:
            raise ValueError(f"{what}: checkpoint hierarchical={ours.get('hierarchical', False)} != "
                             f"{self.options.hierarchical}")
        if ours.get("freeze_step") != self.freeze_step:
            raise ValueError(f"{what}: checkpoint freeze_step {ours.get('freeze_step')} != {self.freeze_step}")
        saved = ours.get("buckets", [])
        self.check_layout(saved)
        for seg, s in zip(self.buckets, saved, strict=True):
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
        error feedback from zero. Call ``check_state_dict``/``check_plain_step`` first. A step started but not taken
        is dropped first (no bucket of it may still be writing the error feedback)."""
        self.abandon()
        if ours is None:
            self.reset_error_feedback()
            self.t = plain_step
        else:
            self.t = int(ours["step"])
            for seg, saved in zip(self.buckets, ours["buckets"], strict=True):
                seg.onebit.load_state_dict(saved["onebit"])
                seg.lamb_coeff_freeze = [float(c) for c in saved["lamb_coeff_freeze"]]
                seg.last_factor = [float(c) for c in saved["last_factor"]]
                if self.options.hierarchical:
                    for target, value in zip(self.hierarchical_errors(seg), saved["hierarchical_errors"], strict=True):
                        self.xp.copy_(target, value)
        for seg in self.buckets:
            seg.denom_key = None

    def error_feedback_buffers(self) -> list[Tensor]:
        hierarchical = self.options.hierarchical
        return [e for seg in self.buckets for e in (seg.onebit.worker_error, seg.onebit.server_error,
                                                     *(self.hierarchical_errors(seg) if hierarchical else ()))]

    def check_plain_step(self, t: int, key: str) -> None:
        """A checkpoint without our section (a plain optimizer's, at step ``t``) is refused where the missing
        state matters: 1-bit LAMB past its warm-up (its averaged trust ratios are lost)."""
        if t > self.freeze_step and self.needs_section_after_warmup:
            raise ValueError(
                f"{self.name}: the optimizer state (step {t}) has no '{key}' section, "
                f"which is needed after freeze_step={self.freeze_step}"
            )
