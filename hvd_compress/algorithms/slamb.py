"""SLAMB: paper 000 (Xu et al., ICML 2023), Algorithm 1 with the Appendix E simplification, as the spec
``shared/specs/slamb.md`` fixes it (the authors' ``Slamb`` = "v1"). Per step t, rank i (spec section 2):

1. g = the local gradient, no gradient allreduce (App. E); ``sync_grad`` (Alg. 1 line 9) averages g[M_t] first.
2. M_t = random_mask(D, k, seed, t) OR always (ndim <= 1 or numel < grad_size_thr; spec 3): the core's Philox.
3. m = b1 m + (1 - b1) g (line 7).    4. m[M_t] = mean over ranks of m[M_t] (lines 8, 10), no index sent.
5. v = b2 v + (1 - b2) g^2, local (line 11).    6. c = where(M_t, 1, b3 c), c_0 = 1 (lines 13-14).
7. u = mh / (sqrt(vh) + eps) + wd x (line 12). Deviation ``variance_floor`` (0 is the paper's rule):
   sqrt(vh) is at least sqrt(variance_floor * mean(vh)) over its layer (``denominator_floor``), and a layer with
   no gradient on this rank yet (vh = 0 throughout) takes no step on its averaged m here.
8. Per layer (lines 15-19, App. E): x -= phi eta u, phi = clip(c r(x[M], u[M]) + (1 - c) r(x[~M], u[~M])),
   eta = c lr + (1 - c) lr / sqrt(n); ndim <= 1: x -= lr r(x, u) u.    9. t mod H == 0: x = mean (line 20).

Invariants: a bucket (``algorithms.bucketed``) runs steps 3-4 for its range of D under the one global mask M_t,
so any cut is the same rule; m, v, c, x and t change only in ``step()``, so a bucket refused on any rank leaves
every state as it was. Why, the step on the wire, checkpoints: docs/algorithms/slamb.md, "How the algorithm runs".
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hvd_compress import ops
from hvd_compress.algorithms import contract
from hvd_compress.algorithms.bucketed import BucketedAlgorithm
from hvd_compress.ops import call_names
from hvd_compress.ops import masks as mask_ops
from hvd_compress.ops import slamb_kernels as fused_ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.traffic import CommMeter


@dataclasses.dataclass(frozen=True)
class SlambOptions:
    """SLAMB's options, with the spec's recommended defaults (section 5)."""

    compress_ratio: float = 0.1  # k: the fraction of momentum elements synchronized each step
    sync_interval: int = 100  # H: the parameters are averaged densely every H steps
    beta3: float = 0.95  # freshness decay of unsynchronized elements
    seed: int = 0  # the masks' Philox seed (must be the same on every rank)
    mask: str = "cyclic"  # "cyclic" (v1, every element once per int(1/k) steps) or "bernoulli" (paper, v2)
    grad_size_thr: int = 9000  # tensors smaller than this (and all 1-D ones) are synchronized every step
    # Bounds of the blended trust ratio phi; None: the wrapped LAMB's own min_coeff / max_coeff (hc.Lamb:
    # 0.01 / 10), so that SLAMB with k = 1, H = 1 and sync_grad is that LAMB for every ratio (spec section 7
    # needs c_min <= ratio <= c_max otherwise); the spec's reference-code values are 0.01 / 1000.
    clip_min: float | None = None
    clip_max: float | None = None
    sync_grad: bool = False  # Alg. 1 line 9: average g[M] before the moments (off: App. E, spec S6)
    # sqrt(vh) of each layer at least sqrt(variance_floor * mean(vh)) (0: the paper's rule). See ``Slamb``.
    variance_floor: float = 0.01

    def validate(self, op_name: str = "SLAMB") -> None:
        k = self.compress_ratio
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0.0 < k <= 1.0:
            raise ValueError(f"op={op_name}: compress_ratio must be in (0, 1], got {k!r}")
        h = self.sync_interval
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"op={op_name}: sync_interval must be an int >= 1, got {h!r}")
        b3 = self.beta3
        if isinstance(b3, bool) or not isinstance(b3, (int, float)) or not 0.0 <= b3 <= 1.0:
            raise ValueError(f"op={op_name}: beta3 must be in [0, 1], got {b3!r}")
        mask_ops.check_mask_args(float(k), self.seed, 0)
        mask_ops.mask_kind(self.mask)
        thr = self.grad_size_thr
        if isinstance(thr, bool) or not isinstance(thr, int) or thr < 0:
            raise ValueError(f"op={op_name}: grad_size_thr must be an int >= 0, got {thr!r}")
        lo = 0.01 if self.clip_min is None else self.clip_min
        hi = max(lo, 1000.0) if self.clip_max is None else self.clip_max
        if not 0.0 < lo <= hi:
            raise ValueError(f"op={op_name}: need 0 < clip_min <= clip_max, got {self.clip_min}, {self.clip_max}")
        vf = self.variance_floor
        if isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0.0 <= vf < math.inf:
            raise ValueError(f"op={op_name}: variance_floor must be a finite number >= 0 (0: the paper's rule), "
                             f"got {vf!r}")
        if not isinstance(self.sync_grad, bool):
            raise ValueError(f"op={op_name}: sync_grad must be True or False, got {self.sync_grad!r}")


def denominator_floor(variance_floor: float, mean: float, bc2: float) -> float:
    """Step 7's least sqrt(vh) on a layer whose mean of the local v is ``mean``: sqrt(variance_floor * mean / bc2),
    0 without the floor (the paper's rule). v is local while m[M] is averaged (spec section 1), so an element
    whose gradient was 0 on this rank has u = m / eps; the floor bounds it by the layer's own scale. A layer with
    no gradient on this rank at all (mean 0: a branch or an expert this rank's batches never reached) has no
    scale: its floor is infinite, so u = wd x there and the averaged m does not move it on this rank, as torch's
    optimizers leave a parameter without a gradient; the parameter average every H steps brings the others'
    steps in. Under the paper's rule u = m / eps there, and phi's lower clip (0.01) steps the layer by about 100
    times its norm."""
    if variance_floor <= 0.0:
        return 0.0
    return math.sqrt(variance_floor * mean / bc2) if mean > 0.0 else math.inf


def ratio(a: float, b: float) -> float:
    """r(a, b) = a / b, or 1 when either norm is 0 (spec S5)."""
    return a / b if a > 0.0 and b > 0.0 else 1.0


@dataclasses.dataclass
class SlambBuffers:
    """The face's flat buffers over the D trainable parameters (float32, param-group order).

    ``grad`` holds this rank's gradient, ``exp_avg``/``exp_avg_sq`` m and v (each parameter's optimizer state is
    a view of them), ``freshness`` c, ``mask`` (bool) M_t, ``work``/``scratch`` temporaries. ``views(flat)``
    gives the per-parameter views of one of them; ``groups`` (param group, first, end) the element ranges.
    """

    params: list[Tensor]
    shapes: list[tuple[int, ...]]
    group_of: list[int]
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    freshness: Tensor
    mask: Tensor
    work: Tensor
    scratch: Tensor
    views: Callable[[Tensor], list[Tensor]]

    @property
    def sizes(self) -> list[int]:
        return [math.prod(s) for s in self.shapes]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def offsets(self) -> list[int]:
        """The first element of each parameter in the flat buffers."""
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return out

    def groups(self) -> list[tuple[int, int, int]]:
        """(param group, first element, end element) of each run of parameters of one group."""
        out: list[tuple[int, int, int]] = []
        at = 0
        for g, size in zip(self.group_of, self.sizes, strict=True):
            if out and out[-1][0] == g:
                out[-1] = (g, out[-1][1], at + size)
            else:
                out.append((g, at, at + size))
            at += size
        return out


@dataclasses.dataclass
class SlambBucket:
    """One bucket: consecutive parameters of param group ``group``, elements [first, first + numel) of the flat
    buffers (D's index space). ``params`` are the parameters themselves (the face hooks them; the algorithm reads
    the flat buffers only)."""

    group: int
    first: int
    sizes: list[int]
    params: list[Tensor]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def end(self) -> int:
        return self.first + self.numel


def group_buckets(buffers: SlambBuffers) -> list[SlambBucket]:
    """One bucket per run of parameters of one param group (the faces without buckets: TF/Keras)."""
    out: list[SlambBucket] = []
    for g, first, size, p in zip(buffers.group_of, buffers.offsets, buffers.sizes, buffers.params, strict=True):
        if not out or out[-1].group != g:
            out.append(SlambBucket(group=g, first=first, sizes=[], params=[]))
        out[-1].sizes.append(size)
        out[-1].params.append(p)
    return out


def _plain(value: Any) -> Any:
    """A shape (list, tuple, torch.Size) as a tuple of ints, to compare a checkpoint's with a parameter's; an element
    count as it is."""
    return tuple(int(d) for d in value) if isinstance(value, (list, tuple)) else value


def always_ranges(shapes: Sequence[tuple[int, ...]], threshold: int) -> list[int]:
    """(offset, length) pairs of the tensors synchronized every step: ndim <= 1 or numel < threshold."""
    out, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        if size and (len(shape) <= 1 or size < threshold):
            if out and out[-2] + out[-1] == at:
                out[-1] += size
            else:
                out += [at, size]
        at += size
    return out


class Slamb(BucketedAlgorithm):
    """SLAMB's sequencing over a face's ``SlambBuffers`` cut into ``buckets`` (default: one per param
    group). See the module docstring; the buckets' pipeline and layout check are ``BucketedAlgorithm``'s."""

    name = "SLAMB"
    options_cls = SlambOptions
    op = AlgorithmOp("SLAMB", 18)
    buffers = "slamb"
    wraps = contract.SLAMB_LAMB

    def __init__(self, options: SlambOptions, backend: Backend, buckets: Sequence[SlambBucket] | None,
                 meter: CommMeter | None, *, buffers: SlambBuffers, world_size: int) -> None:
        """As every algorithm (options, backend, buckets, meter), over the face's flat ``buffers`` (``buckets``
        None: one per param group)."""
        self.options = options
        self.xp = backend
        self.buf = buffers
        self.world_size = int(world_size)
        self.meter = meter if meter is not None else CommMeter()
        self.t = 0
        self.always = always_ranges(buffers.shapes, options.grad_size_thr)
        self.buckets = list(buckets) if buckets is not None else group_buckets(buffers)
        self._init_buckets()
        self._agreement = _Agreement()
        self._counts: dict[int, int] = {}  # bucket -> elements its masked gather selected (the step on the wire)
        self._fused_for: tuple[SlambBuffers, bool] | None = None
        self.xp.add_(self.xp.zero_(buffers.freshness), 1.0)  # c_0 = 1

    # -- the buckets: steps 3 and 4 of one range of D ------------------------------------------------------
    def mutable_state(self, seg: SlambBucket) -> list[Tensor]:
        """None: a bucket writes only the scratch ``work`` and ``mask`` (m, v, c, x change in ``step()``)."""
        return []

    def _masked_allreduce(self, flat: Tensor, seg: SlambBucket, t: int, name: str) -> None:
        """Step 4 on flat[first:end] with M_t restricted to that range (drawn in the core, into mask[first:end])."""
        o, b = self.options, self.buf
        self.meter.run(
            mask_ops.masked_allreduce_, flat[seg.first:seg.end], o.compress_ratio, o.seed, t, o.mask, self.always,
            mask_out=b.mask[seg.first:seg.end], check_finite=True, name=name, offset=seg.first, total=b.numel,
        )

    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i``'s steps 3 and 4 for step ``t`` (Alg. 1 lines 7, 8, 10; with ``sync_grad`` line 9 first),
        on the background thread with overlap: work[first:end] = b1 m + (1 - b1) g, then its masked average under
        the global mask (on the wire path, ``_gather_bucket``: the selected elements only). m itself changes only
        in ``step()``, once every bucket succeeded."""
        seg, b, xp = self.buckets[i], self.buf, self.xp
        if self._on_wire_path():
            self._gather_bucket(i, groups, t)
            return
        if seg.numel == 0:  # nothing to average (the same on every rank: the layout is)
            return
        lo, hi = seg.first, seg.end
        if self.options.sync_grad:  # Alg. 1 line 9: g[M] averaged (the spec's default skips it)
            grad_name = self.call_name(f"{self.name}.grad.{i}", i, groups)
            with failure_joins_as_rejection(self.meter, grad_name):
                self._group(seg, groups)
            self._masked_allreduce(b.grad, seg, t, grad_name)
        name = self.call_name(f"{self.name}.m.{i}", i, groups)
        with failure_joins_as_rejection(self.meter, name):  # step 3 into ``work``
            b1 = self._group(seg, groups)["betas"][0]
            if fused_ops.accepts(b.work[lo:hi], b.exp_avg[lo:hi], b.grad[lo:hi]):  # the core's fused pass
                fused_ops.momentum_(b.work[lo:hi], b.exp_avg[lo:hi], b.grad[lo:hi], b1)
            else:
                w = b.work[lo:hi]
                xp.add_(xp.mul_(xp.copy_(w, b.exp_avg[lo:hi]), b1), b.grad[lo:hi], alpha=1 - b1)
        self._masked_allreduce(b.work, seg, t, name)  # step 4, and M_t[first:end] into mask[first:end]

    def _on_wire_path(self) -> bool:
        """Whether a step overlaps its local work with the masked average (``_gather_bucket``, ``_step_on_wire``):
        the core's fused float32 passes take every buffer and parameter, and no gradient is averaged first
        (``sync_grad`` keeps the sequential path). Decided once per bound set of buffers."""
        b = self.buf
        if self._fused_for is None or self._fused_for[0] is not b:
            ok = not self.options.sync_grad and fused_ops.accepts(
                b.grad, b.exp_avg, b.exp_avg_sq, b.work, b.scratch, b.freshness, *b.params)
            self._fused_for = (b, ok)
        return self._fused_for[1]

    def _gather_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Steps 3 and 4 of bucket ``i`` on the selected elements only, on the background thread: the ranks agree
        on the mask and on finite gradients (``masked_gather_``: M_t[first:end] into mask[first:end]), then
        work[first:first + count] = b1 m[M] + (1 - b1) g[M] (step 3 on those elements, gathered, the same rounding
        as on all), and ``step()`` may start changing state (``_Agreement``) while that compact buffer is
        averaged over the ranks (step 4, one dense allreduce of the same values as ``masked_allreduce_`` sends).
        Nothing in between can fail on one rank alone: its inputs are agreed, finite and in bounds."""
        seg, b, o = self.buckets[i], self.buf, self.options
        lo, hi = seg.first, seg.end
        name = self.call_name(f"{self.name}.m.{i}", i, groups)
        try:
            count = 0
            if seg.numel:
                with failure_joins_as_rejection(self.meter, name):
                    b1 = self._group(seg, groups)["betas"][0]
                count = self.meter.run(
                    mask_ops.masked_gather_, b.grad[lo:hi], None, o.compress_ratio, o.seed, t, o.mask, self.always,
                    mask_out=b.mask[lo:hi], check_finite=True, name=name, offset=lo, total=b.numel)
                fused_ops.momentum_gather_(b.work[lo:hi], b.exp_avg[lo:hi], b.grad[lo:hi], b.mask[lo:hi], b1)
        except BaseException:
            self._agreement.settle(False)
            raise
        self._counts[i] = count
        self._agreement.settle(True)
        if count:
            self.meter.run(ops.allreduce_, b.work[lo:lo + count], op=ReduceOp.Average,
                           name=call_names.suffixed(name, ".avg"))

    def _await_agreement(self, groups: Sequence[dict[str, Any]] | None) -> None:
        """Start every bucket not started yet and wait until each is agreed on (``_gather_bucket``); if any was
        refused, raise on every rank as ``reduce_all`` does, with nothing changed."""
        red = self._pipeline()
        red.mark_all_ready()
        self._launch(groups)
        if not self._agreement.wait(len(self.buckets)):
            self._agreement.reset()  # the next step starts its own count
            self._counts.clear()
            self.reduce_all(groups)  # re-raises the refusal (state untouched: no bucket changes any)
            raise AssertionError(f"{self.name}: a refused bucket drained without an error")

    def synchronize(self, groups: Sequence[dict[str, Any]] | None = None) -> None:
        """The gradient phase of the coming step. On the overlapped path (``_on_wire_path``) with ``overlap``: start
        what is left and wait until every bucket has read its gradients and been agreed on (a refusal raises here
        on every rank); their averages may still be on the wire, ``step()`` overlaps its local work with them.
        Otherwise as ``BucketedAlgorithm.synchronize``."""
        if self.overlap and not self._done and self._on_wire_path():
            self._await_agreement(groups)
            return
        super().synchronize(groups)

    def bucket_gradient(self, i: int) -> Tensor:
        seg = self.buckets[i]
        return self.buf.grad[seg.first:seg.end]

    def writes_gradients(self) -> bool:
        return self.overlap and self.options.sync_grad  # Alg. 1 line 9 averages g[M] in place

    def gradient_final(self, i: int, groups: Sequence[dict[str, Any]], count: int = 1) -> None:
        if self._agreement.complete(len(self.buckets)):  # a gradient after the step's buckets read theirs
            self.abandon()
        super().gradient_final(i, groups, count)

    def abandon(self) -> None:
        super().abandon()
        self._agreement.reset()
        self._counts.clear()

    def _group(self, seg: SlambBucket, groups: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
        if groups is None:
            raise ValueError(f"{self.name}: reducing a bucket needs the param groups")
        return groups[seg.group]

    # -- the step ------------------------------------------------------------------------------------
    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """One SLAMB step on ``buf.grad`` (this rank's gradient); returns the new step count. Steps 3 and 4 of
        the buckets not reduced during backward run first (``reduce_pending``). Nothing changes when it raises
        (bad input on any rank raises on every rank)."""
        xp, b, o = self.xp, self.buf, self.options
        t = self.t + 1
        if self._on_wire_path():
            self._step_on_wire(groups, t)
            self.t = t
            if t % o.sync_interval == 0:  # step 9
                self.synchronize_parameters()
            return t
        self.reduce_pending(groups)  # steps 3 and 4: ``work`` is m's new value, ``mask`` is M_t
        runs = b.groups()
        # The core's fused passes on float32 CPU buffers (both faces' case); the backend's ops otherwise.
        fused = fused_ops.accepts(b.grad, b.exp_avg, b.exp_avg_sq, b.work, b.freshness, *b.params)
        if fused:  # m = work and step 5 in one pass per layer, with the layer's mean(v) for step 7
            means = [fused_ops.moments_(b.exp_avg[lo:hi], b.exp_avg_sq[lo:hi], b.work[lo:hi], b.grad[lo:hi],
                                        groups[b.group_of[i]]["betas"][1]) for i, (lo, hi) in enumerate(self._spans())]
            mask_ops.freshness_(b.freshness, b.mask, o.beta3)  # step 6
            self._fused_update(groups, t, means)  # steps 7 and 8
        else:
            xp.copy_(b.exp_avg, b.work)
            for gi, lo, hi in runs:  # step 5
                b2 = groups[gi]["betas"][1]
                g = b.grad[lo:hi]
                xp.addcmul_(xp.mul_(b.exp_avg_sq[lo:hi], b2), g, g, value=1 - b2)
            mask_ops.freshness_(b.freshness, b.mask, o.beta3)  # step 6
            for gi, lo, hi in runs:
                self._direction(b, groups[gi], t, lo, hi)  # step 7 into ``work``
            self._update(groups, t)  # step 8
        self.t = t
        if t % o.sync_interval == 0:  # step 9
            self.synchronize_parameters()
        return t

    def _direction(self, b: SlambBuffers, group: dict[str, Any], t: int, lo: int, hi: int) -> None:
        """u = mh / (sqrt(vh) + eps) into work[lo:hi] (the weight decay is added per layer)."""
        xp = self.xp
        b1, b2 = group["betas"]
        u = b.work[lo:hi]
        xp.sqrt(b.exp_avg_sq[lo:hi], out=u)
        if group.get("bias_correction", True):
            xp.div_(u, math.sqrt(1 - b2**t))
        floor = self.options.variance_floor
        if floor > 0.0:
            bc2 = 1 - b2**t if group.get("bias_correction", True) else 1.0
            layers = [i for i, start in enumerate(b.offsets) if lo <= start < hi]
            v_views, u_views = b.views(b.exp_avg_sq), b.views(b.work)
            means = xp.foreach_mean([v_views[i] for i in layers])
            for i, mean in zip(layers, means, strict=True):
                xp.clamp_min_(u_views[i], denominator_floor(floor, mean, bc2))
        xp.mul_(xp.reciprocal_(xp.add_(u, group["eps"])), b.exp_avg[lo:hi])
        if group.get("bias_correction", True):
            xp.div_(u, 1 - b1**t)

    def _spans(self) -> list[tuple[int, int]]:
        """(first, end) of each parameter in the flat buffers."""
        return [(at, at + size) for at, size in zip(self.buf.offsets, self.buf.sizes, strict=True)]

    def _clip(self, group: dict[str, Any]) -> tuple[float, float]:
        """phi's bounds: the options', else the wrapped LAMB's (see ``SlambOptions``)."""
        o = self.options
        clip_min = group.get("min_coeff", 0.01) if o.clip_min is None else o.clip_min
        clip_max = group.get("max_coeff", 1000.0) if o.clip_max is None else o.clip_max
        return clip_min, clip_max

    def _update(self, groups: Sequence[dict[str, Any]], t: int) -> None:
        xp, b = self.xp, self.buf
        u_views, c_views, m_views, s_views = (b.views(f) for f in (b.work, b.freshness, b.mask, b.scratch))
        root_n = math.sqrt(self.world_size)
        for i, x in enumerate(b.params):
            group = groups[b.group_of[i]]
            lr, wd, u = group["lr"], group["weight_decay"], u_views[i]
            clip_min, clip_max = self._clip(group)
            if wd != 0.0:
                xp.add_(u, x, alpha=wd)
            if len(b.shapes[i]) <= 1:  # plain LAMB, unclipped (spec step 8)
                xp.add_(x, u, alpha=-lr * ratio(xp.norm(x), xp.norm(u)))
                continue
            x_in, x_out, selected = xp.masked_norms(x, m_views[i])
            u_in, u_out, _ = xp.masked_norms(u, m_views[i])
            phi_max, phi_min = ratio(x_in, u_in), ratio(x_out, u_out)
            if selected == b.sizes[i]:  # c = 1 on the whole layer: phi = clip(phi_max), eta = lr
                xp.add_(x, u, alpha=-lr * min(max(phi_max, clip_min), clip_max))
                continue
            c, s = c_views[i], s_views[i]
            phi = xp.clamp_(xp.add_(xp.mul_(xp.copy_(s, c), phi_max - phi_min), phi_min), clip_min, clip_max)
            xp.mul_(u, phi)
            eta = xp.add_(xp.mul_(xp.copy_(s, c), lr - lr / root_n), lr / root_n)
            xp.addcmul_(x, u, eta, value=-1.0)

    def _layer_direction(self, groups: Sequence[dict[str, Any]], t: int, means: Sequence[float], i: int,
                         u: Tensor, m: Tensor, v: Tensor, x: Tensor, mask: Tensor,
                         local: bool = False) -> tuple[float, ...]:
        """Step 7 of layer ``i`` with the core's fused pass: u, its weight decay and the masked norms (||x[M]||,
        ||x[~M]||, ||u[M]||, ||u[~M]||, |M|); ``local``: u[M] is the factor ``_layer_masked_direction`` needs."""
        group, floor = groups[self.buf.group_of[i]], self.options.variance_floor
        bc1, bc2 = _bias_corrections(group, t)
        return fused_ops.direction_(u, m, v, x, mask, bc1, bc2, denominator_floor(floor, means[i], bc2),
                                    group["eps"], group["weight_decay"], local)

    def _layer_masked_direction(self, groups: Sequence[dict[str, Any]], t: int, i: int, span: tuple[int, int],
                                m_avg: Tensor) -> float:
        """Layer ``i`` (elements ``span``)'s selected elements from their averaged momentum ``m_avg`` (compact):
        m[M], u[M] (in ``scratch``, from the factor ``_layer_direction(local=True)`` left there) and ||u[M]||."""
        b, (lo, hi) = self.buf, span
        group = groups[b.group_of[i]]
        return fused_ops.masked_direction_(b.scratch[lo:hi], b.exp_avg[lo:hi], m_avg, b.params[i], b.mask[lo:hi],
                                           _bias_corrections(group, t)[0], group["weight_decay"])

    def _fused_update(self, groups: Sequence[dict[str, Any]], t: int, means: Sequence[float]) -> None:
        """Steps 7 and 8 per layer with the core's fused passes (``_direction`` then ``_update``, same math):
        u, its weight decay and the masked norms of x and u in one pass, the blended update in a second."""
        b = self.buf
        norms = [self._layer_direction(groups, t, means, i, b.work[lo:hi], b.exp_avg[lo:hi], b.exp_avg_sq[lo:hi], x,
                                       b.mask[lo:hi])
                 for i, (x, (lo, hi)) in enumerate(zip(b.params, self._spans(), strict=True))]
        self._apply_layers(groups, norms, b.work)

    def _apply_layers(self, groups: Sequence[dict[str, Any]], norms: Sequence[Sequence[float]],
                      u_flat: Tensor) -> None:
        """Step 8 per layer from its norms (``_layer_direction``'s) and its u in ``u_flat``."""
        xp, b = self.xp, self.buf
        root_n, u_views = math.sqrt(self.world_size), b.views(u_flat)
        for i, (x, (lo, hi)) in enumerate(zip(b.params, self._spans(), strict=True)):
            group = groups[b.group_of[i]]
            lr = group["lr"]
            x_in, x_out, u_in, u_out, selected = norms[i]
            if len(b.shapes[i]) <= 1:  # plain LAMB, unclipped (spec step 8)
                xp.add_(x, u_views[i], alpha=-lr * ratio(math.hypot(x_in, x_out), math.hypot(u_in, u_out)))
                continue
            clip_min, clip_max = self._clip(group)
            phi_max, phi_min = ratio(x_in, u_in), ratio(x_out, u_out)
            if selected == hi - lo:  # c = 1 on the whole layer: phi = clip(phi_max), eta = lr
                xp.add_(x, u_views[i], alpha=-lr * min(max(phi_max, clip_min), clip_max))
                continue
            fused_ops.apply_(x, u_flat[lo:hi], b.freshness[lo:hi], phi_max, phi_min, clip_min, clip_max, lr,
                             lr / root_n)

    def _step_on_wire(self, groups: Sequence[dict[str, Any]], t: int) -> None:
        """Steps 3-8 with the local work overlapped with the masked average (the buckets' ``_gather_bucket``), the
        same rule and per-element rounding as the sequential path: once every bucket is agreed on, this rank's
        own elements need nothing from the others, so while the averages are on the wire it takes steps 3 and 5
        on the elements kept local (m[~M], v), step 6, and step 7 over every element into ``scratch`` with the
        norms that need no average (x[M], x[~M], u[~M]), leaving in u[M] the factor 1 / (sqrt(vh) + eps) that
        only waits for m[M]. Once the averages are in: m[M] and u[M] from them, with ||u[M]|| (one pass over each
        layer's selected elements, ``masked_direction_``), and step 8. Nothing changes before every rank agreed
        (``_await_agreement`` raises on every rank first)."""
        self._await_agreement(groups)
        try:
            self._finish_on_wire(groups, t)
        except BaseException:  # not a refusal (those raised above); whatever is still on the wire is awaited
            self.abandon()
            raise
        finally:
            self._agreement.reset()
            self._counts.clear()

    def _finish_on_wire(self, groups: Sequence[dict[str, Any]], t: int) -> None:
        """``_step_on_wire`` once every bucket is agreed on."""
        b, o = self.buf, self.options
        spans = self._spans()
        means = [fused_ops.local_moments_(b.exp_avg[lo:hi], b.exp_avg_sq[lo:hi], b.grad[lo:hi], b.mask[lo:hi],
                                          *groups[b.group_of[i]]["betas"]) for i, (lo, hi) in enumerate(spans)]
        mask_ops.freshness_(b.freshness, b.mask, o.beta3)  # step 6
        norms = [list(self._layer_direction(groups, t, means, i, b.scratch[lo:hi], b.exp_avg[lo:hi],
                                            b.exp_avg_sq[lo:hi], x, b.mask[lo:hi], local=True))
                 for i, (x, (lo, hi)) in enumerate(zip(b.params, spans, strict=True))]
        self.reduce_pending(groups)  # every bucket's average: m[M] in work[first:first + count]
        layer = 0
        for j, seg in enumerate(self.buckets):
            within = 0
            for i in range(layer, layer + len(seg.sizes)):
                n = int(norms[i][4])
                if n:  # m[M] and u[M] from the averages, and ||u[M]||
                    norms[i][2] = self._layer_masked_direction(groups, t, i, spans[i],
                                                               b.work[seg.first + within:seg.first + within + n])
                within += n
            layer += len(seg.sizes)
            if within != self._counts.get(j, 0):
                raise AssertionError(f"{self.name}: bucket {j} gathered {self._counts.get(j, 0)} elements, its "
                                     f"layers select {within}")
        self._apply_layers(groups, norms, b.scratch)  # step 8

    def synchronize_parameters(self) -> None:
        """x = mean over ranks of x for every trainable parameter: one dense allreduce (spec step 9)."""
        xp, b = self.xp, self.buf
        views = b.views(b.scratch)
        for v, x in zip(views, b.params, strict=True):
            xp.copy_(v, x)
        self.meter.run(ops.allreduce_, b.scratch, op=ReduceOp.Average, name=f"{self.name}.params")
        for v, x in zip(views, b.params, strict=True):
            xp.copy_(x, v)

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Our section of a face's checkpoint (m and v are the optimizer's per-parameter state), with the
        bucket layout (``buckets``: each bucket's elements, param group, parameter sizes and shapes)."""
        o = self.options
        return {
            "algorithm": self.name,
            "step": self.t,
            "world_size": self.world_size,
            "numel": self.buf.numel,
            "seed": o.seed,
            "compress_ratio": o.compress_ratio,
            "mask": o.mask,
            "freshness": self.xp.copy_(self.xp.float32_like(self.buf.numel, self.buf.freshness), self.buf.freshness),
            "buckets": self._layout(),
        }

    def _layout(self) -> list[dict[str, Any]]:
        """Each bucket's ``layout_state`` with its parameters' shapes: a parameter reshaped to the same element
        count is another model, refused by ``check_layout`` before the face loads the wrapped optimizer's state."""
        shapes = iter(self.buf.shapes)  # the buckets tile the parameters in order
        return [{**self.layout_state(seg), "shapes": [list(next(shapes)) for _ in seg.sizes]} for seg in self.buckets]

    def per_rank_what(self) -> str | None:
        """m outside the step's mask, v (local, line 11) and x between syncs are each rank's (steps 3, 5, 9)."""
        return "moments (each rank's outside the mask)"

    def check_state_dict(self, ours: dict[str, Any]) -> None:
        """Raise a clear ValueError, before anything changes, if ``ours`` cannot be resumed here."""
        what = f"{self.name}.load_state_dict"
        self.check_owner(ours)
        o = self.options
        want = {"world_size": self.world_size, "numel": self.buf.numel, "seed": o.seed,
                "compress_ratio": o.compress_ratio, "mask": o.mask}
        for key, value in want.items():
            if ours.get(key) != value:
                raise ValueError(f"{what}: the checkpoint has {key}={ours.get(key)!r}, this optimizer {value!r}")
        got = self.xp.describe(ours.get("freshness"))
        if got != ("float32", self.buf.numel):
            raise ValueError(f"{what}: freshness is {got}, expected float32 x {self.buf.numel}")
        step = ours.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{what}: step {step!r} is not an int >= 0")
        if "buckets" in ours:  # optional: the state is over D, so a checkpoint without a layout still fits
            self.check_layout(ours["buckets"])

    def check_layout(self, saved: Sequence[dict[str, Any]]) -> None:
        """ValueError, before anything changes, unless the checkpoint's buckets ``saved`` cover this optimizer's
        parameters: the same param group and elements of each, in D's order, and the same shape where the
        checkpoint records shapes (one without shapes is checked by counts). The bucket cut itself may differ
        (the state is over D, a bucket is a range of it)."""
        if all("sizes" in s for s in saved):
            self._check_parameters(saved, "sizes", "elements", self.buf.sizes)
            if all("shapes" in s for s in saved):
                self._check_parameters(saved, "shapes", "shape", self.buf.shapes)
            return
        # A layout of one bucket per param group records its element count only: compare those.
        got = [s.get("numel") for s in saved]
        want = [hi - lo for _, lo, hi in self.buf.groups()]
        if got != want:
            self._refuse_layout("param groups' elements", got, want)

    def _check_parameters(self, saved: Sequence[dict[str, Any]], key: str, what: str, mine: Sequence[Any]) -> None:
        """(param group, ``s[key]`` entry) of each parameter of the checkpoint against (param group, ``mine``)."""
        got = [(s.get("group"), _plain(v)) for s in saved for v in s[key]]
        want = [(g, _plain(v)) for g, v in zip(self.buf.group_of, mine, strict=True)]
        if got != want:
            self._refuse_layout(f"parameters (param group, {what})", got, want)

    def _refuse_layout(self, what: str, got: list[Any], want: list[Any]) -> None:
        raise ValueError(
            f"{self.name}.load_state_dict: the checkpoint's {what} {got} differ from this optimizer's {want}: "
            "another model or param groups (another bucket_mb alone loads: the state is over all D)"
        )

    def load_state_dict(self, ours: dict[str, Any] | None, plain_step: int) -> None:
        """Restore ``state_dict()`` (call ``check_state_dict`` first); ``None`` (a plain LAMB checkpoint at step
        ``plain_step``) starts the freshness at 1. A step started but not taken is dropped."""
        self.abandon()  # no bucket of it may still be reading m or writing ``work``
        if ours is None:
            self.xp.add_(self.xp.zero_(self.buf.freshness), 1.0)
            self.t = int(plain_step)
        else:
            self.xp.copy_(self.buf.freshness, ours["freshness"].reshape(-1))
            self.t = int(ours["step"])


def _bias_corrections(group: dict[str, Any], t: int) -> tuple[float, float]:
    """(1 - b1^t, 1 - b2^t) of a param group at step t, or (1, 1) without bias correction (spec S2, S12)."""
    b1, b2 = group["betas"]
    return (1 - b1**t, 1 - b2**t) if group.get("bias_correction", True) else (1.0, 1.0)


class _Agreement:
    """How many buckets of the coming step settled their agreement (``Slamb._gather_bucket``): agreed on, or
    failed. ``step()`` changes state only once every bucket is agreed on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._settled = 0
        self._failed = False

    def settle(self, agreed: bool) -> None:
        with self._cond:
            self._settled += 1
            self._failed |= not agreed
            self._cond.notify_all()

    def wait(self, n: int) -> bool:
        """Wait until ``n`` buckets settled; whether all were agreed on."""
        with self._cond:
            self._cond.wait_for(lambda: self._settled >= n)
            return not self._failed

    def complete(self, n: int) -> bool:
        with self._cond:
            return self._settled >= n

    def reset(self) -> None:
        with self._cond:
            self._settled, self._failed = 0, False
