"""EF-signSGD with majority vote (``op=hc.SignSGD``, docs/algorithms/signsgd.md, the rule's steps 1-7): the worker
step of Karimireddy et al. (ICML 2019, Alg. 1, EF-signSGD) per rank, the vote of Bernstein et al. (ICLR 2019,
Alg. 1) across ranks.

Per step, bucket and parameter k of d_k elements, on rank r (lr of the wrapped ``torch.optim.SGD``):
p = lr g_r + e_r; s = sign(p) (0 -> +1); c_r = ||p||_1 / d_k; e_r = p - c_r s (the rank's own compressor
error); v = sign(sum_r s) (the vote, a tie -> +1); c = mean_r c_r; x = x - c v, alike on every rank.

The core has no majority-vote collective; the closest is Birder's flat sign allreduce
(``ops.hierarchical_onebit.hierarchical_compressed_allreduce_``, 1 bit up, 1 bit down), whose server quantizes
the mean of the signs stochastically. Given s exactly +/-1, a zero worker error and server error, and injected
uniforms of ``TIE_UNIFORM`` (just below 1/2), its quantizer is deterministic and returns v. The scales c_r travel
in one dense float32 allreduce per bucket (one float per parameter), which shows a non-finite gradient to every rank.
The buckets are Birder's (``BirderBucket``, flat): ``m`` holds e (first numel), ``b`` s and then v.

The learning rate (the rule's step 1). e = p - c_r s is in the units of the lr that formed p (p = lr g + e), and
Karimireddy's Alg. 1 keeps a fixed lr. Carried as it is across an lr change, e would step as the old lr did: at
lr 0, p = e and x would still move. Each bucket keeps the lr its error was made at (``error_lr``, in
``state_dict()``) and ``error_to_lr`` brings e to the current lr before p is formed, so at lr 0 nothing moves and
after a change the steps scale with it, as 0/1 Adam's errors do (``zero_one_adam.errors_to_lr``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from hvd_compress import ops
from hvd_compress.algorithms import contract
from hvd_compress.algorithms.birder import BirderBucket
from hvd_compress.algorithms.bucketed import BucketedAlgorithm
from hvd_compress.ops import call_names, hierarchical_onebit
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.traffic import CommMeter

#: The injected uniform u of Birder's quantizer Q(y) = +1 iff u < (y + 1) / 2: just below 1/2, so that the server's
#: mean vote y = 0 (a tie) gives +1 and any y <= -1/n gives -1 (n < 2**23 ranks); y = +/-1 gives +/-1 for any u.
TIE_UNIFORM = float(np.nextafter(np.float32(0.5), np.float32(0)))


def error_to_lr(xp: Backend, out: Tensor, e: Tensor, error_lr: float, lr: float) -> Tensor | None:
    """e, made at ``error_lr``, in the units of ``lr`` (docs/algorithms/signsgd.md, "The rule", step 1: Karimireddy
    et al. 2019, Alg. 1, p_t = gamma g_t + e_t): e itself where the lrs are equal or ``error_lr`` is unknown (NaN: a
    checkpoint that did not record it), ``out`` = e times lr / error_lr rounded to float32 (e is float32) where both
    are > 0, None (no error) where either is 0. e is left as it is, so a step that fails keeps it. The reference's
    ``error_to_lr`` is the same rule."""
    if lr == error_lr or math.isnan(error_lr):
        return e
    if lr > 0 and error_lr > 0:
        return xp.mul_(xp.copy_(out, e), float(np.float32(lr / error_lr)))
    return None


def check_hyperparameters(group: dict[str, Any]) -> None:
    """ValueError for a param group of the wrapped SGD that the rule does not take."""
    if not group.get("lr", -1) >= 0:
        raise ValueError(f"SignSGD: lr must be >= 0, got {group.get('lr')}")
    for key in ("momentum", "weight_decay", "dampening"):
        if group.get(key, 0) != 0:
            raise ValueError(f"SignSGD: wrap SGD with {key}=0 (EF-signSGD has no {key}), got {group[key]}")
    for key in ("nesterov", "maximize"):
        if group.get(key, False):
            raise ValueError(f"SignSGD: wrap SGD with {key}=False, got {group[key]}")


@dataclasses.dataclass(frozen=True)
class SignSGDOptions:
    """EF-signSGD with majority vote takes no options of its own beside the buckets."""

    hierarchical: ClassVar[bool] = False  # the vote is flat: every rank a worker (Birder's buckets read it)

    def validate(self, op_name: str) -> None:
        del op_name


class SignSGD(BucketedAlgorithm):
    """EF-signSGD with majority vote over the face's buckets; lr read when a bucket is reduced."""

    name = "SignSGD"
    options_cls = SignSGDOptions
    op = AlgorithmOp("SignSGD", 20)
    buffers = "flat"  # Birder's buckets: m holds e, b the signs and then the vote
    bucket_scalars: ClassVar[tuple[str, ...]] = ("error_lr",)  # the lr each bucket's e was made at
    wraps = contract.SGD

    def __init__(self, options: SignSGDOptions, backend: Backend, buckets: Sequence[BirderBucket],
                 meter: CommMeter | None) -> None:
        super().__init__(options, backend, buckets, meter)
        self._scales: dict[int, list[float]] = {}  # bucket -> this step's c of each parameter
        self._lrs: dict[int, float] = {}  # bucket -> this step's lr, its error_lr once the step is taken
        self._uniforms: dict[int, tuple[Tensor, Tensor]] = {}  # padded numel -> (worker, server) uniforms

    @staticmethod
    def state_numels(numel: int, hierarchical: bool) -> tuple[int, int]:
        """(c1, c2) of a bucket (Birder's flat sizes: ``m`` and ``b`` hold numel <= c1 elements)."""
        return hierarchical_onebit.state_numels(numel, False)

    def mutable_state(self, seg: BirderBucket) -> list[Tensor]:
        return [seg.m]

    def _tie_uniforms(self, seg: BirderBucket) -> tuple[Tensor, Tensor]:
        dpad = hierarchical_onebit.padded_numel(seg.numel, ops.size())
        if dpad not in self._uniforms:
            uw = self.xp.add_(self.xp.float32_like(dpad * ops.size(), seg.grad), TIE_UNIFORM)
            us = self.xp.add_(self.xp.float32_like(dpad, seg.grad), TIE_UNIFORM)
            self._uniforms[dpad] = (uw, us)
        return self._uniforms[dpad]

    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i`` for step ``t``: p, s, c_r and the new e (kept aside in ``update``), the scales' mean, the
        vote; e is committed only once every rank's vote succeeded."""
        xp, seg = self.xp, self.buckets[i]
        n = seg.numel
        e, s, p = seg.m[:n], seg.b[:n], seg.update
        name = self.call_name(f"{self.name}.{i}", i, groups)
        with failure_joins_as_rejection(self.meter, call_names.suffixed(name, ".scale")):
            if groups is None:
                raise ValueError(f"{self.name}: reducing a bucket needs the param groups")
            group = groups[seg.group]
            check_hyperparameters(group)
            lr = group["lr"]
            carried = error_to_lr(xp, seg.worker_error[:n], e, seg.error_lr, lr)  # worker_error: scratch here
            xp.mul_(xp.copy_(p, seg.grad), lr)
            if carried is not None:
                xp.add_(p, carried)  # p = lr g + e
            xp.copy_(s, p >= 0)
            xp.add_(xp.mul_(s, 2.0), -1.0)  # s = sign(p), 0 -> +1
            xp.abs(p, out=seg.worker_error[:n])
            local = xp.foreach_mean(seg.views(seg.worker_error[:n]))  # c_r = ||p||_1 / d per parameter
            scales = xp.float32_like(len(local), seg.grad)
            for k, c in enumerate(local):
                scales[k] = c
            self.backup(i)
        self.meter.run(ops.allreduce_, scales, op=ReduceOp.Average, name=call_names.suffixed(name, ".scale"))
        mean = [float(c) for c in scales.tolist()]
        if not all(math.isfinite(c) for c in mean):
            raise UsageError(f"{self.name}: non-finite gradient on some rank (bucket {i}); state unchanged")
        for pk, sk, c in zip(seg.views(p), seg.views(s), local, strict=True):
            xp.sub(pk, sk, alpha=c, out=pk)  # e_r = p - c_r s, committed after the vote
        xp.zero_(seg.worker_error)
        xp.zero_(seg.server_error)
        uw, us = self._tie_uniforms(seg)
        self.meter.run(
            hierarchical_onebit.hierarchical_compressed_allreduce_, s, seg.worker_error, seg.server_error,
            payload=hierarchical_onebit.PAYLOAD_SIGN, hierarchical=False, uniforms=(uw, us),
            name=call_names.suffixed(name, ".vote"),
        )
        xp.copy_(e, p)
        self._scales[i] = mean
        self._lrs[i] = lr

    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """x = x - c v on every bucket (reducing the buckets not reduced yet); returns the new step count."""
        for group in groups:
            try:
                check_hyperparameters(group)
            except ValueError:
                self.abandon()
                raise
        self.reduce_pending(groups)
        for i, seg in enumerate(self.buckets):
            votes = seg.views(seg.b[: seg.numel])
            for x, v, c in zip(seg.params, votes, self._scales[i], strict=True):
                self.xp.add_(x, v, alpha=-c)
            seg.error_lr = self._lrs[i]  # with the step: a bucket's failure restores every e (backup), not this
        self.t += 1
        return self.t

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        xp = self.xp
        return {
            "algorithm": self.name,
            "step": self.t,
            "world_size": ops.size(),
            "buckets": [{**self.layout_state(seg), "error": xp.copy_(xp.float32_like(seg.numel, seg.m),
                                                                       seg.m[: seg.numel]),
                         "error_lr": float(seg.error_lr)}
                        for seg in self.buckets],
        }

    def check_state_dict(self, ours: dict[str, Any] | None) -> None:
        """A clear ValueError, before anything changes, if ``ours`` cannot be loaded here."""
        what = f"{self.name}.load_state_dict"
        if ours is None:
            raise ValueError(f"{what}: the checkpoint has no SignSGD state (error feedback)")
        self.check_owner(ours)
        if ours.get("world_size") != ops.size():
            raise ValueError(f"{what}: checkpoint world_size {ours.get('world_size')!r} != this run's {ops.size()}")
        saved = ours.get("buckets", [])
        self.check_layout(saved)
        for seg, s in zip(self.buckets, saved, strict=True):
            if self.xp.describe(s.get("error")) != ("float32", seg.numel):
                raise ValueError(f"{what}: error is {self.xp.describe(s.get('error'))}, expected float32 x "
                                 f"{seg.numel}")
            error_lr = s.get("error_lr", math.nan)
            if not isinstance(error_lr, int | float) or error_lr < 0:
                raise ValueError(f"{what}: error_lr is {error_lr!r}, expected a float >= 0 (or NaN)")

    def check_plain_step(self, t: int, key: str) -> None:
        """A plain SGD checkpoint starts EF-signSGD with zero error only at step 0."""
        if t > 0:
            self.check_state_dict(None)

    def error_feedback_buffers(self) -> list[Tensor]:
        return [seg.m for seg in self.buckets]

    def load_state_dict(self, ours: dict[str, Any] | None, plain_step: int = 0) -> None:
        """Restore ``state_dict()`` (``check_state_dict`` first); None: zero error at ``plain_step``."""
        self.abandon()
        if ours is None:
            self.reset_error_feedback()
            for seg in self.buckets:
                seg.error_lr = 0.0
        else:
            for i, seg in enumerate(self.buckets):
                self.xp.copy_(seg.m[: seg.numel], ours["buckets"][i]["error"])
                seg.error_lr = float(ours["buckets"][i].get("error_lr", math.nan))  # none: in the next step's lr
        self.t = plain_step if ours is None else int(ours["step"])
