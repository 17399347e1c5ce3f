"""The torch engine of every algorithm of ``hvd_compress.algorithms`` (1-bit Adam/LAMB, Birder, SLAMB), whose
buckets are buckets (``hvd_compress.algorithms.bucketed``), written once: cutting the parameters into buckets, the
gradient hooks that report each parameter whose gradient is final so that its bucket's reduction starts while
backward runs (``overlap``), counting backward passes, gathering the fused gradients, stepping the algorithm,
zeroing the fused buffers, metering bytes and carrying the algorithm's section of ``state_dict()``. Each
algorithm's engine adds its buffers (``buckets``) and the views of the wrapped optimizer's state (``bind_state``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from hvd_compress.ops.buckets import cut_buckets as ops_cut_buckets
from hvd_compress.ops.errors import UsageError
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients
from hvd_compress.torch.wrapping import (
    HELD_BACK,
    STATE_KEY,
    Engine,
    any_rank_nonfinite,
    at_end_of_backward,
    check_named_parameters,
    closure_loss,
    hook_gradients,
    own_section,
)


def cut_buckets(
    param_groups: list[dict[str, Any]], bucket_mb: float
) -> tuple[list[tuple[int, list[torch.nn.Parameter]]], list[int]]:
    """The buckets of each (param group, dtype, device), as ``op=Average`` cuts its buckets
    (``ops.buckets.cut_buckets``: the trainable parameters in reverse registration order, ``bucket_mb`` MiB, the
    first bucket of each key 1 MiB).

    Returns each bucket's (param group, parameters) in registration order (the order of the checkpoint's bucket
    list: a model with one bucket per group keeps the layout of one bucket per group) and the bucket indices in
    bucket order (the order their reductions start)."""
    trainable = [(gi, p) for gi, group in enumerate(param_groups) for p in group["params"] if p.requires_grad]
    items = [((gi, p.dtype, p.device), p.numel() * p.element_size()) for gi, p in trainable]
    buckets, order = ops_cut_buckets(items, bucket_mb)
    return [(trainable[members[0]][0], [trainable[i][1] for i in members]) for members in buckets], order


def make_buckets(param_groups: list[dict[str, Any]], bucket_mb: float, dtypes: tuple[torch.dtype, ...],
                    refusal: str, make: Callable[[int, list[torch.nn.Parameter], FusedGradients], Any],
                    ) -> tuple[list[Any], list[FusedGradients], list[int]]:
    """The buckets of each param group (``cut_buckets``), in registration order, each
    ``make(group index, parameters, their FusedGradients)``; their gradient buffers, and the bucket indices in
    bucket order. A trainable parameter of a dtype not in ``dtypes``: ValueError(``refusal`` with its
    ``{dtype}``)."""
    for group in param_groups:
        for p in group["params"]:
            if p.requires_grad and p.dtype not in dtypes:
                raise ValueError(refusal.format(dtype=p.dtype))
    planned, order = cut_buckets(param_groups, bucket_mb)
    buckets, grads = [], []
    for gi, params in planned:
        fused = FusedGradients(params)
        buckets.append(make(gi, params, fused))
        grads.append(fused)
    return buckets, grads, order


class BucketedEngine(Engine):
    """The engine of a ``BucketedAlgorithm`` (``alg``). A subclass's ``build`` makes the algorithm, its buckets
    and their ``FusedGradients``. With ``overlap`` the gradient hook that makes a parameter's gradient final (its
    last backward pass of ``backward_passes_per_step``) gathers it into its bucket's fused buffer and reports it
    (``gradient_final``); a complete bucket starts reducing on the background thread. ``synchronize()`` waits for
    all; ``zero_grad()`` first drops a step started but not taken.

    The end of the backward pass (``end_of_backward``) makes the buckets' early start invisible to code between
    ``backward()`` and ``step()`` that changes ``.grad`` (DDP's clipping, torch's AMP recipe): buckets that average
    the gradients in place are waited for, as DDP's backward waits; where the buckets consumed the gradients as
    they were (a compressed stage), ``step()`` finds a later change on any rank and reduces the changed gradients
    anew, as after ``synchronize()``."""

    exports = ("overlap", "bucket_count")
    amp_scaling = True

    def __init__(self, optimizer: torch.optim.Optimizer, base: type, named_parameters: Any,
                 backward_passes_per_step: int, algorithm: type, options: Any, overlap: bool,
                 bucket_mb: float) -> None:
        super().__init__(optimizer, base)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        check_named_parameters(params, named_parameters)
        self.meter = CommMeter()
        self.alg, buckets, self.grads, order = self.build(optimizer.param_groups, algorithm, options, bucket_mb)
        self.alg.order, self.alg.overlap = order, bool(overlap)
        if self.mirrors_step:
            self.alg.t = self.plain_step(self.base.state_dict(optimizer))
        self.bind_state()
        trainable = [p for s in buckets for p in s.params]
        self.bucket_of = {id(p): i for i, s in enumerate(buckets) for p in s.params}
        self.fused_of = {id(p): fused for fused in self.grads for p in fused.params}
        self.passes = PassCounter(trainable, backward_passes_per_step)
        hook_gradients(trainable, self.count_pass)

    # -- what an algorithm's engine supplies ------------------------------------------------------------
    #: Whether the wrapped optimizer's per-parameter ``state['step']`` mirrors the algorithm's step: the algorithm
    #: starts at the step of a wrapped optimizer that has stepped, and ``step()`` writes the new step back.
    mirrors_step = True

    def build(self, param_groups: list[dict[str, Any]], algorithm: type, options: Any,
              bucket_mb: float) -> tuple[Any, list[Any], list[FusedGradients], list[int]]:
        """``algorithm(options, BACKEND, buckets, self.meter)`` (the contract of ``hvd_compress.algorithms``), its
        buckets, the ``FusedGradients`` that hold their gradients, and the bucket order."""
        raise NotImplementedError

    def bind_state(self) -> None:
        """Make the wrapped optimizer's per-parameter state views of the algorithm's buffers (``bind_views``)."""

    def bind_views(self, pieces: Iterable[tuple[Any, list[tuple[str, torch.Tensor]]]]) -> None:
        """For each (owner, [(key, flat buffer), ...]) of ``pieces``, where the owner (a bucket) has ``params`` and
        ``views(flat)``: make each parameter's ``state[key]`` its view of the buffer, keeping the values it held
        (a wrapped optimizer that has stepped, a loaded state), and its ``state['step']`` the algorithm's."""
        state = self.opt.state
        for owner, keys in pieces:
            for key, flat in keys:
                for p, view in zip(owner.params, owner.views(flat), strict=True):
                    old = state[p].get(key)
                    if old is not None and old.data_ptr() != view.data_ptr():
                        view.copy_(old)
                    state[p][key] = view
            for p in owner.params:
                state[p]["step"] = torch.tensor(float(self.alg.t), dtype=torch.float32)

    # -- the gradient phase -----------------------------------------------------------------------------
    def count_pass(self, p: torch.Tensor) -> None:
        passes = self.passes.add(p)
        self.protocol.synchronized = False  # a new gradient after synchronize() starts another gradient phase
        if self.alg.overlap and passes == self.passes.limit:
            ensure_init()
            i = self.bucket_of[id(p)]
            self.fused_of[id(p)].gather_one(p)  # a .grad set from outside (model.zero_grad()) into its view
            self.alg.gradient_final(i, self.opt.param_groups)
            if self.alg.launched:
                at_end_of_backward(self)

    def end_of_backward(self) -> None:
        """At the end of a backward pass that started buckets: wait for them where they average ``.grad`` in place
        (a warm-up), so that ``backward()`` returns the averages; fingerprint the gradients of the started buckets
        where they were consumed as they were, or where later buckets are held back (a parameter without a
        gradient) with this rank's own gradients beside the averages. A nested pass (reentrant checkpointing) ends
        first; the outer one records again."""
        in_place = self.alg.writes_gradients()
        if in_place:
            self.alg.wait_launched()
        started = self.alg.launched_gradients()
        held_back = in_place and len(started) < len(self.alg.buckets)
        self.protocol.remember_backward(started if self.alg.consumes_gradients_in_synchronize() or held_back else [])

    @property
    def overlap(self) -> bool:
        """Whether buckets are reduced during backward (``overlap=`` of ``DistributedOptimizer``)."""
        return self.alg.overlap

    @property
    def bucket_count(self) -> int:
        """The buckets the parameters are cut into, each with its own state."""
        return len(self.alg.buckets)

    @torch.no_grad()
    def synchronize(self) -> None:
        """End the gradient phase: gather this rank's gradients into the fused buffers (and, with overlap or in a
        1-bit warm-up, finish the buckets' reductions). Where the algorithm has already consumed the gradients as
        they were (with overlap, a compressed stage), an edit of ``.grad`` before ``step()`` (Horovod's clipping
        pattern) is honoured: ``step()`` drops this phase's reductions, state restored, and reduces the edited
        gradients (a second exchange in that step; ``overlap=False`` clips at the cost of one)."""
        self.gradient_phase()
        self.protocol.remember(self.consumed_gradients())

    def gradient_phase(self) -> None:
        ensure_init()
        for fused in self.grads:
            fused.gather()
        self.alg.synchronize(self.opt.param_groups)
        self.passes.reset()
        self.protocol.mark_synchronized()

    def consumed_gradients(self) -> list[torch.Tensor | None]:
        if not self.alg.consumes_gradients_in_synchronize():
            return []
        for fused in self.grads:
            fused.gather()  # a ``.grad`` the user replaced instead of editing it in place
        return [b for fused in self.grads for b in fused.buffers]

    # -- the step -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        """The step, on every rank alike. Gradients edited after the algorithm consumed them (clipping after
        ``synchronize()``) are reduced anew. With ``scaler.step(opt)`` the gradients are unscaled here, and the
        step is skipped on every rank if any rank's held inf/NaN (the verdict written back into each scaler);
        where the algorithm had consumed them still scaled (overlap, a compressed stage), they are reduced anew
        once unscaled (pass ``overlap=False`` to reduce only once)."""
        loss = closure_loss(closure)
        rejected = None
        try:
            edited = self._gradient_phase_for_step(grad_scaler is not None)
        except UsageError as e:  # scaled gradients with inf/NaN: refused on every rank; the scaler decides below
            if grad_scaler is None:
                raise
            rejected, edited = e, True
        if grad_scaler is not None:
            edited = edited or self.alg.consumes_gradients_in_synchronize()
            if any_rank_nonfinite(grad_scaler, self.opt, f"{self.alg.name}.found_inf"):
                self.alg.abandon()
                self.protocol.step_done()
                return loss
            if rejected is not None:
                raise rejected
        if edited:  # reduce the gradients as they are now (the abandoned reductions' state restored)
            self.alg.abandon()
        t = self.alg.step(self.opt.param_groups)
        if self.mirrors_step:
            self.fill_step(t)
        self.protocol.step_done()
        return loss

    def _gradient_phase_for_step(self, scaled: bool) -> bool:
        """The gradient phase unless a ``synchronize()`` ran it; True where the gradients it consumed were edited
        (since that ``synchronize()``, or else since the end of backward)."""
        if self.protocol.for_step():
            self.gradient_phase()
            return self._edited_since_backward(scaled)
        return self.protocol.seen is not None and self.protocol.edited(self.consumed_gradients())

    def _edited_since_backward(self, scaled: bool) -> bool:
        """Whether any rank changed the gradients of the buckets started during backward before this ``step()``
        (``end_of_backward``): True where those buckets consumed them as they were (reduce anew); where they
        averaged them in place and later buckets were held back, UsageError on every rank. The agreement is made on
        every rank alike whenever buckets may start during backward; under a scaler a consuming step reduces anew
        anyway."""
        consumes, in_place = self.alg.consumes_gradients_in_synchronize(), self.alg.writes_gradients()
        if not (consumes or in_place) or (consumes and scaled):
            return False
        if not self.protocol.edited_since_backward():
            return False
        if consumes:
            return True
        self.alg.abandon()
        self.protocol.step_done()
        raise UsageError(HELD_BACK.format(name=f"DistributedOptimizer(op={self.alg.name})", until="step()") +
                         "; step not taken")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers; ``.grad`` becomes None (torch's default), or with ``set_to_none=False``
        stays a zeroed view of them, which saves a copy per step. The count of backward passes starts again (also
        after a step that raised). A step whose buckets were started but not taken is dropped first (their state
        restored), never zeroing a bucket that is still being reduced."""
        self.alg.abandon()
        for fused in self.grads:
            fused.zero_(set_to_none)
        self.zero_untracked_grads(set_to_none)
        self.passes.reset()
        self.protocol.step_done()

    def fill_step(self, t: int) -> None:
        """Every parameter's ``state['step']`` of the wrapped optimizer at ``t`` (``mirrors_step``)."""
        state = self.opt.state
        for fused in self.grads:
            for p in fused.params:
                state[p]["step"].fill_(float(t))

    # -- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out = self.base.state_dict(self.opt)
        out[STATE_KEY] = own_section(self.alg.committed_state_dict())
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``. One without the algorithm's section (a plain torch checkpoint of the
        wrapped optimizer) starts the algorithm's own state afresh at that checkpoint's step, where the
        algorithm allows it; a checkpoint of another algorithm, world size or model raises ValueError with
        nothing changed."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        if ours is not None and "segments" in ours and "buckets" not in ours:  # the list's name in 0.1.0 checkpoints
            ours = {**ours, "buckets": ours.pop("segments")}
        t = 0
        if ours is not None:
            self.alg.check_state_dict(ours)
        else:
            t = self.plain_step(state_dict)
        self.base.load_state_dict(self.opt, state_dict)
        self.alg.load_state_dict(ours, t)
        self.drop_another_ranks_error_feedback(ours, self.alg.name, self.alg.error_feedback_what())
        self.bind_state()

    def error_feedback(self) -> list[torch.Tensor]:
        return self.alg.error_feedback_buffers()

    def reset_error_feedback(self) -> None:
        self.alg.reset_error_feedback()

    def per_rank_what(self) -> str | None:
        return self.alg.per_rank_what()

    def per_rank_fallback(self, root: int) -> str:
        if self.error_feedback():
            return f"starts its {self.alg.error_feedback_what()} from zero and takes the rest from rank {root}"
        return f"takes rank {root}'s"

    def plain_step(self, state_dict: dict[str, Any]) -> int:
        """The step of a plain checkpoint (the largest per-parameter ``step``), if the algorithm can start there."""
        steps = [float(s["step"]) for s in state_dict.get("state", {}).values() if "step" in s]
        t = int(max(steps)) if steps else 0
        self.alg.check_plain_step(t, STATE_KEY)
        return t
