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
from hvd_compress.torch.wrapping import (
    SynchronizeProtocol,
    any_rank_nonfinite,
    check_named_parameters,
    hook_gradients,
)


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


class AdasumMixin(SynchronizeProtocol):
    """Methods added to the wrapped optimizer's class for op=Adasum.

    ``synchronize()`` means: finish every rank's local step and Adasum-reduce the parameter deltas. The
    gradients were consumed by the local steps, so a ``step()`` after an edit of ``.grad`` (clipping) raises
    on every rank: clip before ``backward()`` returns, or use ``op=hc.Average``."""

    _step_supports_amp_scaling = True

    def _hvdc_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        backward_passes_per_step: int,
        grad_scaler: Any = None,
        **options: Any,
    ) -> None:
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        check_named_parameters(params, named_parameters)
        self._hvdc_options = AdasumOptions(**options)
        self._hvdc_params = params
        self._hvdc_scaler = grad_scaler
        self._hvdc_buckets = _make_buckets(params, int(self._hvdc_options.bucket_mb * (1 << 20)))
        self._hvdc_where = {
            id(p): (b, i) for b in self._hvdc_buckets for i, p in enumerate(b.params)
        }
        self._hvdc_written: set[int] = set()  # parameters whose delta this step is in its bucket
        self._hvdc_reductions = DeltaReductions([len(b.params) for b in self._hvdc_buckets])
        self._hvdc_passes = PassCounter(params, backward_passes_per_step)
        self._hvdc_meter = CommMeter()
        hook_gradients(params, self._hvdc_on_grad)

    # -- local step and delta ------------------------------------------------------------------
    def _hvdc_step_only(self, params: list[torch.nn.Parameter]) -> None:
        """The wrapped optimizer's step restricted to ``params`` (the others keep their state)."""
        ids = {id(p) for p in params}
        saved = [g["params"] for g in self.param_groups]
        try:
            for g in self.param_groups:
                g["params"] = [p for p in g["params"] if id(p) in ids]
            super(self.__class__, self).step()
        finally:
            for g, ps in zip(self.param_groups, saved, strict=True):
                g["params"] = ps

    def _hvdc_local_update(self, params: list[torch.nn.Parameter]) -> None:
        """Step ``params`` locally, write each delta into its bucket view, restore the parameter."""
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            self._hvdc_step_only([p for p in params if p.grad is not None])
            for p, start in zip(params, starts, strict=True):
                bucket, i = self._hvdc_where[id(p)]
                torch.sub(p, start, out=bucket.views[i])
                p.copy_(start)
                self._hvdc_written.add(id(p))
                self._hvdc_reductions.mark_ready(bucket.index)

    def _hvdc_on_grad(self, p: torch.Tensor) -> None:
        self._hvdc_synchronized = False
        if self._hvdc_passes.add(p) < self._hvdc_passes.limit or self._hvdc_scaler is not None:
            return
        ensure_init()
        self._hvdc_local_update([p])
        self._hvdc_launch_ready()

    # -- communication -------------------------------------------------------------------------
    def _hvdc_reduce_bucket(self, index: int) -> None:
        b = self._hvdc_buckets[index]
        self._hvdc_meter.run(
            ops.adasum_fused_,
            b.flat,
            b.sizes,
            name=f"DistributedOptimizer.adasum.{b.index}",
            hierarchical=self._hvdc_options.hierarchical,
        )

    def _hvdc_launch_ready(self) -> None:
        """Start, in bucket order, every bucket whose deltas are all written."""
        self._hvdc_reductions.launch_ready(self._hvdc_reduce_bucket)

    def synchronize(self) -> None:
        """Finish every local update, reduce all deltas and wait for them (step() calls this). The local steps
        have consumed the gradients: a ``step()`` that finds them changed since (clipping after ``synchronize()``)
        raises on every rank instead of ignoring the change."""
        self._hvdc_gradient_phase()
        self._hvdc_remember_gradients()

    def _hvdc_consumed_gradients(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self._hvdc_params]

    def _hvdc_gradient_phase(self) -> None:
        ensure_init()
        pending = [p for p in self._hvdc_params if id(p) not in self._hvdc_written]
        if pending:
            self._hvdc_local_update(pending)
        self._hvdc_launch_ready()
        try:
            self._hvdc_reductions.drain()
        except Exception:
            self._hvdc_reset()
            raise
        self._hvdc_mark_synchronized()

    def _hvdc_apply(self) -> None:
        with torch.no_grad():
            for b in self._hvdc_buckets:
                for p, view in zip(b.params, b.views, strict=True):
                    p.add_(view)

    def _hvdc_reset(self) -> None:
        self._hvdc_step_done()
        self._hvdc_written.clear()
        self._hvdc_reductions.reset()
        self._hvdc_passes.reset()

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scaler is not None and self._hvdc_scaler is None:
            raise ValueError(
                "scaler.step(opt) with op=hc.Adasum needs the scaler at construction: "
                "hc.DistributedOptimizer(opt, op=hc.Adasum, grad_scaler=scaler)"
            )
        if self._hvdc_scaler is not None:
            if grad_scaler is None:
                raise ValueError("this optimizer was built with grad_scaler=: call scaler.step(opt), not opt.step()")
            if any_rank_nonfinite(grad_scaler, self, "adasum.found_inf"):
                self._hvdc_reset()
                return loss
        if self._hvdc_synchronize_for_step():
            self._hvdc_reset()
            raise UsageError(
                "op=hc.Adasum: the gradients changed between synchronize() and step() on some rank (clipping "
                "them?), but each rank's optimizer had already stepped on them as they were: step not applied on "
                "any rank (the wrapped optimizer's state has advanced). Adasum reduces parameter deltas, not "
                "gradients: change gradients before backward() returns (a tensor hook), or use op=hc.Average"
            )
        self._hvdc_apply()
        self._hvdc_reset()
        return loss

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self._hvdc_meter.take()
