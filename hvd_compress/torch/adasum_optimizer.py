"""``hc.DistributedOptimizer(op=hc.Adasum)``, the PyTorch face of ``hvd_compress.algorithms.adasum_delta``.

The algorithm (paper 002, Section 4.1: step locally, then Adasum the parameter delta: the deltas, their
buckets, the in-order background reductions and ``p = start + reduced delta``) is ``AdasumDelta`` of
``algorithms/adasum_delta.py``. This face does what needs torch: the fused delta buffers, and a
post-accumulate hook on each parameter that runs the wrapped optimizer's step for that parameter alone as
soon as its gradient is final and hands it to ``AdasumDelta.gradient_final``; ``step()`` finishes the rest.

Mixed precision: pass ``grad_scaler=`` (a ``torch.amp.GradScaler``) and call ``scaler.step(opt)``.
Gradients are then still scaled when the hooks fire, so the local steps wait for ``step()``: it
unscales, agrees with all ranks on whether any rank saw inf/NaN, and skips the step on every rank
if one did (writing the global verdict back into the scaler, so that every rank's ``scaler.update()``
moves the scale the same way). That path has no overlap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress.algorithms.adasum_delta import AdasumDelta, AdasumOptions, DeltaBucket, plan_buckets
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import flat_with_views
from hvd_compress.torch.wrapping import (
    Engine,
    any_rank_nonfinite,
    at_end_of_backward,
    check_named_parameters,
    closure_loss,
    hook_gradients,
)


def _make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[DeltaBucket]:
    plan = plan_buckets([((p.dtype, p.device), p.numel() * p.element_size()) for p in params], bucket_bytes)
    buckets = []
    for members in plan:
        ps = [params[i] for i in members]
        flat, views = flat_with_views(ps)
        buckets.append(DeltaBucket(len(buckets), ps, flat, views, [p.numel() for p in ps]))
    return buckets


class AdasumEngine(Engine):
    """The engine of op=Adasum.

    ``synchronize()`` means: finish every rank's local step and Adasum-reduce the parameter deltas. The
    gradients were consumed by the local steps (those of the hooks during backward), so a ``step()`` after an
    edit of ``.grad`` (clipping after ``synchronize()``, or after ``backward()`` as DDP scripts do) raises on
    every rank: clip before ``backward()`` returns, or use ``op=hc.Average``."""

    amp_scaling = True
    frozen_later_ok = True  # a frozen parameter gets no gradient, so no local step: it stays, as under torch

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
        self.params = params
        self.scaler = grad_scaler
        self.meter = CommMeter()
        buckets = _make_buckets(params, int(options.bucket_mb * (1 << 20)))
        self.alg = AdasumDelta(options, BACKEND, buckets, self.meter)
        self.passes = PassCounter(params, backward_passes_per_step)
        hook_gradients(params, self.on_grad)
        self._stepped: list[torch.nn.Parameter] = []  # the parameters the hooks stepped in the last backward pass


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
        """Step ``params`` locally from where they are; the algorithm takes each delta and restores them."""
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            self.step_only([p for p in params if p.grad is not None])
            self.alg.gradient_final(params, starts)

    def on_grad(self, p: torch.Tensor) -> None:
        self.protocol.synchronized = False
        if self.passes.add(p) < self.passes.limit or self.scaler is not None:
            return
        ensure_init()
        self.local_update([p])
        at_end_of_backward(self)

    def end_of_backward(self) -> None:
        """The gradients the hooks' local steps consumed during this backward pass, fingerprinted for ``step()``."""
        pending = set(map(id, self.alg.pending(self.params)))
        self._stepped = [p for p in self.params if id(p) not in pending]
        self.protocol.remember_backward([p.grad for p in self._stepped])

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
        pending = self.alg.pending(self.params)
        if pending:
            self.local_update(pending)
        try:
            self.alg.synchronize()
        except Exception:
            self.reset()
            raise
        self.protocol.mark_synchronized()

    def reset(self) -> None:
        self.protocol.step_done()
        self.alg.abandon()
        self.passes.reset()

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        loss = closure_loss(closure)
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
        if self.protocol.for_step():
            self.gradient_phase()
            # the hooks step locally only without a scaler: then every rank asks whether any rank's changed
            stepped = self._stepped
            edited = self.scaler is None and self.protocol.edited_since_backward(lambda _: [p.grad for p in stepped])
            since = "backward()"
        else:
            edited = self.protocol.seen is not None and self.protocol.edited(self.consumed_gradients())
            since = "synchronize()"
        if edited:
            self.reset()
            raise UsageError(
                f"op=hc.Adasum: the gradients changed between {since} and step() on some rank (clipping them?), but "
                "each rank's optimizer had already stepped on them as they were: step not applied on any rank (the "
                "wrapped optimizer's state has advanced). Adasum reduces parameter deltas, not gradients: change "
                "gradients before backward() returns (a tensor hook), or use op=hc.Average"
            )
        with torch.no_grad():
            self.alg.step()
        self.reset()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(self.opt, set_to_none)

    def per_rank_what(self) -> str | None:
        """The wrapped optimizer's state: each rank steps it on its own gradient (paper 002, Section 4.1)."""
        return "optimizer state (each rank steps on its own gradient)" if self.opt.state else None

    def per_rank_fallback(self, root: int) -> str:
        return f"takes rank {root}'s"
