"""``hc.DistributedOptimizer(torch.optim.AdamW(...), op=hc.ZeroOneAdam)``: the PyTorch face of
``hvd_compress.algorithms.zero_one_adam`` (0/1 Adam, docs/algorithms/zero-one-adam-spec.md).

The algorithm (the step kinds, the schedules, the checkpoint schema) lives in ``hvd_compress/algorithms``. This
face keeps the tensors: per bucket of each param group one bucket of flat float32 buffers, of which every
parameter's ``.grad`` and ``state['exp_avg']``/``['exp_avg_sq']`` are views (so ``state_dict()`` holds m and v as
Adam's), beside u, x_anchor, the collective's buffer and the error feedback (``OneBitState``). Changes made to the
parameters between steps show in torch's version counters (``Tensor._version``; the core's own writes do not count
there, and the face's are over when a step returns): the algorithm then synchronizes them (spec Z20).
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress.algorithms.zero_one_adam import ZeroOneAdam, ZeroOneAdamOptions, ZeroOneBucket, check_hyperparameters
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.bucketed import BucketedEngine, make_buckets
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, cached_views, flat_with_views
from hvd_compress.torch.onebit import OneBitState


def _bucket(gi: int, params: list[torch.nn.Parameter], fused: FusedGradients) -> ZeroOneBucket:
    """One bucket's bucket (``make_buckets``): x_anchor starts at the parameters."""
    device = fused.buffers[0].device
    numel = sum(p.numel() for p in params)
    anchor = flat_with_views(params)[0]
    torch.cat([p.detach().reshape(-1) for p in params], out=anchor)
    return ZeroOneBucket(
        group=gi, params=params, sizes=[p.numel() for p in params], grad=fused.buffers[0],
        exp_avg=flat_with_views(params)[0], exp_avg_sq=flat_with_views(params)[0],
        u=flat_with_views(params)[0], anchor=anchor, work=torch.zeros(numel, device=device),
        scratch=torch.zeros(numel, device=device), denom=torch.zeros(numel, device=device),
        onebit=OneBitState(numel, torch.float32, device=device), views=cached_views(params),
    )


class ZeroOneAdamEngine(BucketedEngine):
    """The engine of ``op=hc.ZeroOneAdam`` over a wrapped Adam/AdamW (its lr, betas, eps, weight_decay read every
    step; weight decay decoupled, no bias correction: spec Z2, Z3).

    Buckets as ``op=Average`` cuts them (``bucket_mb``), each with its own error feedback, u and x_anchor. With
    ``overlap=True`` (the default) the hook that makes a bucket's last gradient final starts its collective on the
    background thread: the dense average on a variance step, the 1-bit average of the gradients on the other
    phase-1 steps, of u + lr m_r on a sync step, none on a local step. ``overlap=False`` makes the same calls after
    backward: bit-identical results. ``synchronize()`` averages ``.grad`` densely only on a variance step.
    """

    exports = (*BucketedEngine.exports, "step_kind", "synchronize_parameters")
    _versions: list[tuple[int, int]] | None = None  # ``_param_versions`` after the last step taken (Z20)

    def build(self, param_groups: list[dict[str, Any]], algorithm: type[ZeroOneAdam], options: ZeroOneAdamOptions,
              bucket_mb: float) -> tuple[ZeroOneAdam, list[ZeroOneBucket], list[FusedGradients], list[int]]:
        for group in param_groups:  # refused at construction, not at the first step (and again every step)
            check_hyperparameters(algorithm.name, group)
        buckets, grads, order = make_buckets(param_groups, bucket_mb, (torch.float32,),
                                                 "op=ZeroOneAdam supports float32 parameters only", _bucket)
        built = algorithm(options, BACKEND, buckets, self.meter)
        built.detects_edits = True
        return built, buckets, grads, order

    def bind_state(self) -> None:
        """Make every parameter's ``exp_avg``/``exp_avg_sq`` views of the bucket buffers, keeping their values. The
        parameters then count as unchanged: a checkpoint's and its model's come in either order."""
        self.bind_views((seg, [("exp_avg", seg.exp_avg), ("exp_avg_sq", seg.exp_avg_sq)]) for seg in self.alg.buckets)
        self._versions = None

    def _param_versions(self) -> list[tuple[int, int]]:
        """Each parameter's version counter and storage (``p.data = ...`` brings a new tensor's counter)."""
        return [(p._version, p.data_ptr()) for seg in self.alg.buckets for p in seg.params]

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        """``BucketedEngine.step``, telling the algorithm whether this rank's parameters changed since the last
        step taken (Z20); a step not taken (refused, or skipped by the scaler) leaves that to the next one."""
        self.alg.parameters_edited = self._versions is not None and self._versions != self._param_versions()
        t = self.alg.t
        loss = super().step(closure, grad_scaler)
        if self.alg.t != t:
            self._versions = self._param_versions()
        return loss

    @torch.no_grad()
    def synchronize_parameters(self) -> None:
        """End the local interval now (spec Z20): the parameters averaged over all ranks (one dense allreduce) and
        taken as the last sync's. Before evaluating or saving one rank's model between syncs; the face does it
        itself at the step after a change to the parameters. Before phase 2 nothing to do. A step whose buckets
        were started but not taken is dropped first (as by ``zero_grad()``)."""
        ensure_init()
        self.alg.abandon()
        self.alg.synchronize_parameters()
        self._versions = self._param_versions() if self._versions is not None else None

    @property
    def step_kind(self) -> str:
        """What the coming step does: "variance", "onebit", "local" or "sync" (spec section 3)."""
        return self.alg.step_kind()

