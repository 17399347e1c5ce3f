"""``hc.DistributedOptimizer(op=hc.Adasum)``: apply the optimizer first, then Adasum the parameter delta.

Paper 002 (Adasum, MLSys 2021), Section 4.1: with an adaptive optimizer Adasum combines the
*updates* each rank's optimizer computed from its own gradient, not the gradients. Per rank:
``delta_r = step(p, g_r) - p``; then ``p <- p + Adasum_r(delta_r)`` (Algorithm 1 for the reduction).

Overlap: a post-accumulate hook on each parameter runs the wrapped optimizer's step for that
parameter alone as soon as its gradient is final, writes the delta into a view of a bucket buffer,
and restores the parameter. A bucket whose deltas are all written is Adasum-reduced on a background
thread (the core releases the GIL), in bucket order, which is the same on every rank; ``step()``
finishes the rest, waits, and applies ``p = start + reduced delta``.

Mixed precision: pass ``grad_scaler=`` (a ``torch.amp.GradScaler``) and call ``scaler.step(opt)``.
Gradients are then still scaled when the hooks fire, so the local steps wait for ``step()``: it
unscales, agrees with all ranks on whether any rank saw inf/NaN, and skips the step on every rank
if one did (writing the global verdict back into the scaler, so that every rank's ``scaler.update()``
moves the scale the same way). That path has no overlap.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce
from hvd_compress.torch.fused import flat_with_views
from hvd_compress.torch.wrapping import CommMeter, PassCounter, check_named_parameters

DEFAULT_BUCKET_MB = 16.0


@dataclasses.dataclass
class _Bucket:
    """Parameters of one dtype whose deltas travel in one fused Adasum call."""

    index: int
    params: list[torch.nn.Parameter]
    flat: torch.Tensor
    views: list[torch.Tensor]
    ready: set[int] = dataclasses.field(default_factory=set)
    future: concurrent.futures.Future | None = None

    @property
    def sizes(self) -> list[int]:
        return [p.numel() for p in self.params]


def _make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
    # Reverse registration order approximates the order gradients become final in backward, so
    # early buckets fill first and their communication overlaps the rest of backward.
    buckets: list[_Bucket] = []
    open_by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}

    def close(members: list[torch.nn.Parameter]) -> None:
        flat, views = flat_with_views(members)
        buckets.append(_Bucket(len(buckets), members, flat, views))

    for p in reversed(params):
        key = (p.dtype, p.device)
        members = open_by_dtype.setdefault(key, [])
        members.append(p)
        if sum(q.numel() * q.element_size() for q in members) >= bucket_bytes:
            close(members)
            open_by_dtype[key] = []
    for members in open_by_dtype.values():
        if members:
            close(members)
    return buckets


class AdasumMixin:
    """Methods added to the wrapped optimizer's class for op=Adasum."""

    _step_supports_amp_scaling = True

    def _hvdc_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        backward_passes_per_step: int,
        hierarchical: bool | None = None,
        grad_scaler: Any = None,
        bucket_mb: float = DEFAULT_BUCKET_MB,
    ) -> None:
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        check_named_parameters(params, named_parameters)
        self._hvdc_params = params
        self._hvdc_hierarchical = hierarchical
        self._hvdc_scaler = grad_scaler
        self._hvdc_buckets = _make_buckets(params, int(bucket_mb * (1 << 20)))
        self._hvdc_where = {
            id(p): (b, i) for b in self._hvdc_buckets for i, p in enumerate(b.params)
        }
        self._hvdc_start: dict[int, torch.Tensor] = {}
        self._hvdc_next_launch = 0
        self._hvdc_passes = PassCounter(params, backward_passes_per_step)
        self._hvdc_meter = CommMeter()
        self._hvdc_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hvdc-adasum")
        self._hvdc_hooks = [p.register_post_accumulate_grad_hook(self._hvdc_on_grad) for p in params]

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
                bucket.ready.add(id(p))

    def _hvdc_on_grad(self, p: torch.Tensor) -> None:
        if self._hvdc_passes.add(p) < self._hvdc_passes.limit or self._hvdc_scaler is not None:
            return
        ensure_init()
        self._hvdc_local_update([p])
        self._hvdc_launch_ready()

    # -- communication -------------------------------------------------------------------------
    def _hvdc_launch_ready(self) -> None:
        """Start, in bucket order, every bucket whose deltas are all written."""
        while self._hvdc_next_launch < len(self._hvdc_buckets):
            b = self._hvdc_buckets[self._hvdc_next_launch]
            if len(b.ready) < len(b.params):
                return
            b.future = self._hvdc_pool.submit(
                self._hvdc_meter.run,
                ops.adasum_fused_,
                b.flat,
                b.sizes,
                name=f"DistributedOptimizer.adasum.{b.index}",
                hierarchical=self._hvdc_hierarchical,
            )
            self._hvdc_next_launch += 1

    def synchronize(self) -> None:
        """Finish every local update, reduce all deltas and wait for them (step() calls this)."""
        ensure_init()
        pending = [p for p in self._hvdc_params if id(p) not in self._hvdc_where[id(p)][0].ready]
        if pending:
            self._hvdc_local_update(pending)
        self._hvdc_launch_ready()
        errors = []
        for b in self._hvdc_buckets:
            try:
                b.future.result()
            except Exception as e:  # re-raised below, once every bucket is drained
                errors.append(e)
        if errors:
            self._hvdc_reset()
            raise errors[0]

    def _hvdc_apply(self) -> None:
        with torch.no_grad():
            for b in self._hvdc_buckets:
                for p, view in zip(b.params, b.views, strict=True):
                    p.add_(view)

    def _hvdc_reset(self) -> None:
        for b in self._hvdc_buckets:
            b.ready.clear()
            b.future = None
        self._hvdc_next_launch = 0
        self._hvdc_passes.reset()

    def _hvdc_any_rank_nonfinite(self, grad_scaler: Any) -> bool:
        """Unscale through ``grad_scaler`` and OR its inf/NaN verdict over all ranks, written back."""
        grad_scaler.unscale_(self)
        found = grad_scaler._found_inf_per_device(self)
        local = sum(float(t.item()) for t in found.values())
        total = allreduce(torch.tensor([local], dtype=torch.float64), op=ReduceOp.Sum, name="adasum.found_inf")
        verdict = 1.0 if total.item() > 0 else 0.0
        for t in found.values():
            t.fill_(verdict)
        return verdict > 0

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
            if self._hvdc_any_rank_nonfinite(grad_scaler):
                self._hvdc_reset()
                return loss
        self.synchronize()
        self._hvdc_apply()
        self._hvdc_reset()
        return loss

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self._hvdc_meter.take()
