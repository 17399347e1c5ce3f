"""``hc.DistributedOptimizer(op=hc.Adasum)``, the PyTorch face of ``hvd_compress.algorithms.adasum_delta``.

The algorithm (paper 002, Section 4.1: step locally, then Adasum the parameter delta), its bucket plan and
the in-order background reductions live in ``algorithms/adasum_delta.py``. This face does what needs torch:
a post-accumulate hook on each parameter runs the wrapped optimizer's step for that parameter alone as
soon as its gradient is final, writes the delta into a view of its bucket buffer and restores the
parameter; ``step()`` finishes the rest, waits, and applies ``p = start + reduced delta``.

Mixed precision: pass ``grad_scaler=`` (a ``torch.amp.GradScaler``) and call ``scaler.step(opt)``.
Gradients are then still scaled when the hooks fire, so the local steps wait for ``step()``: it
unscales, agrees with all ranks on whether any rank saw inf/NaN, and skips the step on every rank
if one did (writing the global verdict back into the scaler, so that every rank's ``scaler.update()``
moves the scale the same way). That path has no overlap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.algorithms.adasum_delta import AdasumOptions, DeltaReductions, plan_buckets
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import flat_with_views
from hvd_compress.torch.wrapping import Engine, any_rank_nonfinite, check_named_parameters, hook_gradients


@dataclasses.dataclass
class _Bucket:
    """Parameters of one dtype whose deltas travel in one fused Adasum call."""

    index: int
    params: list[torch.nn.Parameter]
    flat: torch.Tensor
    views: list[torch.Tensor]

    @property
    def sizes(self) -> list[int]:
        return [p.numel() for p in self.params]


def _make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
    plan = plan_buckets([((p.dtype, p.device), p.numel() * p.element_size()) for p in params], bucket_bytes)
    buckets = []
    for members in plan:
        ps = [params[i] for i in members]
        flat, views = flat_with_views(ps)
        buckets.append(_Bucket(len(buckets), ps, flat, views))
    return buckets


class AdasumEngine(Engine):
    """The engine of op=Adasum.

    ``synchronize()`` means: finish every rank's local step and Adasum-reduce the parameter deltas. The
    gradients were consumed by the local steps, so a ``step()`` after an edit of ``.grad`` (clipping) raises
    on every rank: clip before ``backward()`` returns, or use ``op=hc.Average``."""

    amp_scaling = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base: type,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        backward_passes_per_step: int,
        grad_scaler: Any,
        options: AdasumOptions,
    ) -> None:
        super().__init__(optimizer, base)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        check_named_parameters(params, named_parameters)
        self.options = options
        self.params = params
        self.scaler = grad_scaler
        self.buckets = _make_buckets(params, int(options.bucket_mb * (1 << 20)))
        self.where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self.written: set[int] = set()  # parameters whose delta this step is in its bucket
        self.reductions = DeltaReductions([len(b.params) for b in self.buckets])
        self.passes = PassCounter(params, backward_passes_per_step)
        self.meter = CommMeter()
        hook_gradients(params, self.on_grad)

    # -- local step and delta ------------------------------------------------------------------
    def step_only(self, params: list[torch.nn.Parameter]) -> None:
        """The wrapped optimizer's step restricted to ``params`` (the others keep their state)."""
        opt = self.opt
        ids = {id(p) for p in params}
        saved = [g["params"] for g in opt.param_groups]
        try:
            for g in opt.param_groups:
                g["params"] = [p for p in g["params"] if id(p) in ids]
            self.base.step(opt)
        finally:
            for g, ps in zip(opt.param_groups, saved, strict=True):
                g["params"] = ps

    def local_update(self, params: list[torch.nn.Parameter]) -> None:
        """Step ``params`` locally, write each delta into its bucket view, restore the parameter."""
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            self.step_only([p for p in params if p.grad is not None])
            for p, start in zip(params, starts, strict=True):
                bucket, i = self.where[id(p)]
                torch.sub(p, start, out=bucket.views[i])
                p.copy_(start)
                self.written.add(id(p))
                self.reductions.mark_ready(bucket.index)

    def on_grad(self, p: torch.Tensor) -> None:
        self.protocol.synchronized = False
        if self.passes.add(p) < self.passes.limit or self.scaler is not None:
            return
        ensure_init()
        self.local_update([p])
        self.launch_ready()

    # -- communication -------------------------------------------------------------------------
    def reduce_bucket(self, index: int) -> None:
        b = self.buckets[index]
        self.meter.run(
            ops.adasum_fused_,
            b.flat,
            b.sizes,
            name=f"DistributedOptimizer.adasum.{b.index}",
            hierarchical=self.options.hierarchical,
        )

    def launch_ready(self) -> None:
        """Start, in bucket order, every bucket whose deltas are all written."""
        self.reductions.launch_ready(self.reduce_bucket)

    def synchronize(self) -> None:
        """Finish every local update, reduce all deltas and wait for them (step() calls this). The local steps
        have consumed the gradients: a ``step()`` that finds them changed since (clipping after ``synchronize()``)
        raises on every rank instead of ignoring the change."""
        self.gradient_phase()
        self.protocol.remember(self.consumed_gradients())

    def consumed_gradients(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self.params]

    def gradient_phase(self) -> None:
        ensure_init()
        pending = [p for p in self.params if id(p) not in self.written]
        if pending:
            self.local_update(pending)
        self.launch_ready()
        try:
            self.reductions.drain()
        except Exception:
            self.reset()
            raise
        self.protocol.mark_synchronized()

    def apply(self) -> None:
        with torch.no_grad():
            for b in self.buckets:
                for p, view in zip(b.params, b.views, strict=True):
                    p.add_(view)

    def reset(self) -> None:
        self.protocol.step_done()
        self.written.clear()
        self.reductions.reset()
        self.passes.reset()

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scaler is not None and self.scaler is None:
            raise ValueError(
                "scaler.step(opt) with op=hc.Adasum needs the scaler at construction: "
                "hc.DistributedOptimizer(opt, op=hc.Adasum, grad_scaler=scaler)"
            )
        if self.scaler is not None:
            if grad_scaler is None:
                raise ValueError("this optimizer was built with grad_scaler=: call scaler.step(opt), not opt.step()")
            if any_rank_nonfinite(grad_scaler, self.opt, "adasum.found_inf"):
                self.reset()
                return loss
        if self.protocol.for_step(self.gradient_phase, self.consumed_gradients):
            self.reset()
            raise UsageError(
                "op=hc.Adasum: the gradients changed between synchronize() and step() on some rank (clipping "
                "them?), but each rank's optimizer had already stepped on them as they were: step not applied on "
                "any rank (the wrapped optimizer's state has advanced). Adasum reduces parameter deltas, not "
                "gradients: change gradients before backward() returns (a tensor hook), or use op=hc.Average"
            )
        self.apply()
        self.reset()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(self.opt, set_to_none)
