"""Birder: paper 004 (NeurIPS 2023), Algorithm 1 and Section 4, as specs/birder.md fixes it.

- ``uncompressed_step``: the rule without compression (SoftSignSGD of paper 004; ``hc.Birder`` alone or
  under ``op=hc.Average``): m = beta m + (1 - beta) g (Alg. 1 line 5, spec 3.2); b = beta b + (1 - beta) |g|
  (line 6, spec 3.3; no sqrt(v), no bias correction); x = x - lr m / (b + eps) - lr wd x (spec 3.7, B3, B4:
  eps in the denominator, decoupled decay).
- ``BirderAlgorithm``: ``op=hc.Birder``, the 1-bit algorithm. Per step and bucket one core call, the
  Hierarchical-1-bit-All-Reduce (``ops.hierarchical_onebit``, spec 4) in "grad" mode (B5): the node-mean gradient
  updates this rank's shard of m and b, the ratio r = m / (b + eps) (lines 5-7, spec 3.4) plus the worker
  error is quantized (lines 8-9, spec 3.5), the server averages, adds its error and re-quantizes (lines
  11-12, spec 3.6); every rank receives the same u in {+/-1}^d and applies x = x - lr u - lr wd x (line 13,
  spec 3.7), identically everywhere. No warm-up (spec 1). ``hierarchical=False``: every rank is a worker.

Invariants: one ``BirderBucket`` per bucket, its draws keyed by ``hierarchical_onebit.bucket_seed(seed, i)``;
overlap on and off make the same calls; a bucket refused on any rank restores every bucket's state and t does not
advance.
Buckets, overlap and checkpoints: docs/algorithms/birder.md, "How the algorithm runs".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from hvd_compress import ops
from hvd_compress.algorithms import contract
from hvd_compress.algorithms.bucketed import BucketedAlgorithm
from hvd_compress.ops import hierarchical_onebit
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.constants import AlgorithmOp
from hvd_compress.ops.traffic import CommMeter

DEFAULTS = {"lr": 1e-3, "beta": 0.95, "eps": 1e-8, "weight_decay": 0.0}  # spec 5


def check_hyperparameters(lr: float, beta: float, eps: float, weight_decay: float) -> None:
    """ValueError for values the rule cannot take."""
    if not lr >= 0:
        raise ValueError(f"Birder: lr must be >= 0, got {lr}")
    if not 0 <= beta < 1:
        raise ValueError(f"Birder: beta must be in [0, 1), got {beta}")
    if not eps > 0:
        raise ValueError(f"Birder: eps must be > 0, got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"Birder: weight_decay must be >= 0, got {weight_decay}")


def uncompressed_step(xp: Backend, params: Sequence[Tensor], grads: Sequence[Tensor], ms: Sequence[Tensor],
                      bs: Sequence[Tensor], scratch: Sequence[Tensor], group: dict[str, Any]) -> None:
    """One step of the uncompressed rule on each (param, grad, m, b); ``scratch`` like the params, float32."""
    beta, eps, lr, wd = group["beta"], group["eps"], group["lr"], group["weight_decay"]
    for g, m, b, tmp in zip(grads, ms, bs, scratch, strict=True):
        xp.add_(xp.mul_(m, beta), g, alpha=1 - beta)  # line 5
        xp.add_(xp.mul_(b, beta), xp.abs(g, out=tmp), alpha=1 - beta)  # line 6
        xp.add_(xp.copy_(tmp, b), eps)
    if wd != 0:
        xp.foreach_mul_(params, 1 - lr * wd)  # decoupled decay on the old x (B4)
    xp.foreach_addcdiv_(params, ms, scratch, value=-lr)


@dataclasses.dataclass(frozen=True)
class BirderOptions:
    """``hierarchical``: Section 4's hierarchical all-reduce over the nodes (workers = nodes); ``seed``: RNG."""

    hierarchical: bool = False
    seed: int = 0

    def validate(self, op_name: str) -> None:
        if not isinstance(self.hierarchical, bool):
            raise ValueError(f"op={op_name}: hierarchical must be True or False, got {self.hierarchical!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"op={op_name}: seed must be an int in [0, 2**64), got {self.seed!r}")


@dataclasses.dataclass
class BirderBucket:
    """The float32 parameters of one bucket (of one param group), with the face's flat buffers.

    ``grad``: the fused gradient (each parameter's ``.grad`` is a view); ``update``: float32 numel, the input
    of the collective and its result u; ``m``, ``b``, ``worker_error`` (c1) and ``server_error`` (c2): state;
    ``error_lr``: SignSGD's lr of the step that left its error in ``m`` (``bucket_scalars``; Birder's rule has none).
    """

    group: int
    params: list[Tensor]
    sizes: list[int]
    grad: Tensor
    update: Tensor
    m: Tensor
    b: Tensor
    worker_error: Tensor
    server_error: Tensor
    views: Callable[[Tensor], list[Tensor]]
    error_lr: float = 0.0

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def buffers(self) -> dict[str, Tensor]:
        return {"m": self.m, "b": self.b, "worker_error": self.worker_error, "server_error": self.server_error}


class BirderAlgorithm(BucketedAlgorithm):
    """Alg. 1 of paper 004 over the face's buckets; the group's lr, beta, eps, weight_decay read every
    step (beta and eps when the bucket is reduced, lr and weight_decay in ``step``). The buckets' pipeline, backups
    and layout check are ``BucketedAlgorithm``'s."""

    name = "Birder"
    options_cls = BirderOptions
    op = AlgorithmOp("Birder", 19)
    buffers = "flat"
    #: Per-bucket float state beside the buffers (``BirderBucket`` fields), alike on every rank: kept by the faces
    #: (the TF face as one float64 variable each, a value per bucket)
    bucket_scalars: ClassVar[tuple[str, ...]] = ()
    wraps = contract.BIRDER

    def __init__(self, options: BirderOptions, backend: Backend, buckets: Sequence[BirderBucket],
                 meter: CommMeter | None) -> None:
        super().__init__(options, backend, buckets, meter)
        self.seed = options.seed

    @staticmethod
    def state_numels(numel: int, hierarchical: bool) -> tuple[int, int]:
        """(c1, c2) of a bucket of ``numel`` elements on this world."""
        return hierarchical_onebit.state_numels(numel, hierarchical)

    def mutable_state(self, seg: BirderBucket) -> list[Tensor]:
        """What the core call updates: the shards of m and b (lines 5-6), the worker and server error (9, 12)."""
        return list(seg.buffers().values())

    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i``'s one core call for step ``t`` (Alg. 1 lines 4-12, "grad" mode, spec B5), on the
        background thread with overlap: this rank's gradient in, u in {+/-1} out in ``update``; m, b and both
        errors, copied aside first, are updated inside the core. Its draws are keyed by ``bucket_seed`` (each
        bucket a stream of its own, see the top)."""
        seg = self.buckets[i]
        name = self.call_name(f"{self.name}.u.{i}", i, groups)
        with failure_joins_as_rejection(self.meter, name):
            if groups is None:
                raise ValueError(f"{self.name}: reducing a bucket needs the param groups")
            group = groups[seg.group]
            check_hyperparameters(group["lr"], group["beta"], group["eps"], group["weight_decay"])
            self.xp.copy_(seg.update, seg.grad)
            self.backup(i)  # a later bucket may still fail: keep a way back
        self.meter.run(
            hierarchical_onebit.hierarchical_compressed_allreduce_, seg.update, seg.worker_error, seg.server_error,
            payload=hierarchical_onebit.PAYLOAD_SIGN, hierarchical=self.options.hierarchical,
            seed=hierarchical_onebit.bucket_seed(self.seed, i), step=t, moments=(seg.m, seg.b), beta=group["beta"],
            eps=group["eps"], name=name,
        )

    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """One step (Alg. 1 lines 4-13) on every bucket, reducing the buckets not reduced yet; returns the new
        step count (with the seed, the RNG position: it advances only here, so a rejected step draws again the
        same). Nothing changes if any bucket fails on any rank."""
        xp = self.xp
        t = self.t + 1
        for group in groups:  # lr and weight_decay are first used below: refuse them before any state changes
            try:
                check_hyperparameters(group["lr"], group["beta"], group["eps"], group["weight_decay"])
            except ValueError:
                self.abandon()
                raise
        self.reduce_pending(groups)
        for seg in self.buckets:  # line 13: x = x - lr u - lr wd x, the same on every rank
            group = groups[seg.group]
            lr, wd = group["lr"], group["weight_decay"]
            if wd != 0:
                xp.foreach_mul_(seg.params, 1 - lr * wd)
            xp.foreach_add_(seg.params, seg.views(seg.update), alpha=-lr)
        self.t = t
        return t

    # -- checkpoints -----------------------------------------------------------------------------------
    def layout(self) -> dict[str, Any]:
        """What a checkpoint must match: world and node size, mode."""
        return {
            "world_size": ops.size(),
            "node_size": hierarchical_onebit.node_size(self.options.hierarchical),
            "hierarchical": self.options.hierarchical,
        }

    def state_dict(self) -> dict[str, Any]:
        xp = self.xp
        return {
            "algorithm": self.name,
            "step": self.t,
            "seed": self.seed,
            **self.layout(),
            "buckets": [
                {**self.layout_state(seg), **{k: xp.copy_(xp.zeros_like(v), v) for k, v in seg.buffers().items()}}
                for seg in self.buckets
            ],
        }

    def check_state_dict(self, ours: dict[str, Any] | None) -> None:
        """A clear ValueError, before anything changes, if ``ours`` cannot be loaded here."""
        what = f"{self.name}.load_state_dict"
        if ours is None:
            raise ValueError(f"{what}: the checkpoint has no Birder state (errors, moments, RNG position)")
        self.check_owner(ours)
        for key, value in self.layout().items():
            if ours.get(key) != value:
                raise ValueError(f"{what}: checkpoint {key} {ours.get(key)!r} != this run's {value!r}")
        saved = ours.get("buckets", [])
        self.check_layout(saved)
        for seg, s in zip(self.buckets, saved, strict=True):
            for key, target in seg.buffers().items():
                if self.xp.describe(s.get(key)) != self.xp.describe(target):
                    raise ValueError(f"{what}: {key} is {self.xp.describe(s.get(key))}, expected "
                                     f"{self.xp.describe(target)}")

    def check_plain_step(self, t: int, key: str) -> None:
        """A plain checkpoint cannot start Birder mid-run: its errors, moments and RNG position are missing."""
        self.check_state_dict(None)

    def error_feedback_buffers(self) -> list[Tensor]:
        """The worker and server errors (Alg. 1's c1 and c2), and with more than one rank per node m and b too.
        Hierarchically (spec 4) rank (j, l) keeps m and b of chunk C_l only, so another rank's are the moments of
        other elements: loaded or broadcast onto this rank they would drive its chunk's first steps by another
        chunk's ratio m / b. Flat, m and b are the whole model's (this worker's estimate, which another rank's may
        stand in for, as Horovod's resume gives it)."""
        return [e for seg in self.buckets
                for e in ((seg.m, seg.b) if self.sharded_moments() else ()) + (seg.worker_error, seg.server_error)]

    def error_feedback_what(self) -> str:
        return "error feedback and its chunk's m and b" if self.sharded_moments() else "error feedback"

    def sharded_moments(self) -> bool:
        """Whether m and b are this rank's chunk's only (hierarchical, more than one rank per node)."""
        return hierarchical_onebit.node_size(self.options.hierarchical) > 1

    def load_state_dict(self, ours: dict[str, Any], plain_step: int = 0) -> None:
        """Restore ``state_dict()`` (call ``check_state_dict`` first); a step started but not taken is dropped.
        ``plain_step``: unused (``check_plain_step`` refuses every plain checkpoint)."""
        del plain_step
        self.abandon()  # no bucket of it may still be writing m, b or the errors
        self.t = int(ours["step"])
        self.seed = int(ours["seed"])
        for seg, saved in zip(self.buckets, ours["buckets"], strict=True):
            for key, target in seg.buffers().items():
                self.xp.copy_(target, saved[key])
