"""Algorithm buckets, reduced in bucket order while backward runs: the mechanics that
1-bit Adam/LAMB (``onebit``), Birder (``birder``) and SLAMB (``slamb``) share, written once.

Each bucket (cut by ``ops.buckets.plan_buckets``) has its own state and one collective call per
step (``reduce_bucket``, the subclass's). ``gradient_final`` (a face's gradient hook, ``overlap=True``) reduces a
bucket whose members are all final on the process's one background thread, strictly in bucket order
(``ops.buckets.BucketReductions``), so every rank issues the same collectives in the same order; ``reduce_all``
starts the rest and awaits all, and ``overlap=False`` makes the very same calls there, so both agree bit for bit.

State untouched on rejection: each bucket copies aside what its call mutates (``mutable_state``, ``backup``);
if any bucket fails on any rank (a Python error on one rank joins the call as a rejection:
``ops.buckets.failure_joins_as_rejection``), every bucket is restored once all have finished and the error is
raised on every rank; ``abandon`` restores the same way. ``check_layout`` refuses a checkpoint of another bucket
layout with ValueError before anything changes (per-bucket state cannot move to another cut); one without layout
keys loads where its buckets have the same sizes. SLAMB overrides it: its state is element-wise over D.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hvd_compress.algorithms import agreement
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import BucketReductions
from hvd_compress.ops.errors import MismatchError, UsageError
from hvd_compress.ops.traffic import CommMeter

#: The param-group keys the algorithms' rules read: what must be equal on every rank for their parameters to stay equal.
HYPER_KEYS = ("lr", "betas", "beta", "eps", "weight_decay", "max_coeff", "min_coeff")


def checkpoint_op(section: Any) -> str:
    """In words, the op whose wrapper wrote ``section`` (a checkpoint's ``hvd_compress`` entry), for a refusal: an
    algorithm names itself; the faces' reductions with state (PowerSGD, top-k/random-k) keep theirs under a key."""
    if not isinstance(section, dict):
        return f"no op ({type(section).__name__})"
    if section.get("algorithm"):
        return f"op={section['algorithm']}"
    if "powersgd" in section:
        return "op=PowerSGD"
    if "compression" in section:
        return f"compression={section['compression']}"
    return "an op with no state of its own"


class BucketedAlgorithm:
    """The bucket pipeline of one optimizer. A subclass sets ``name``, ``xp``, ``meter``, ``buckets`` (each with
    ``group``, ``sizes``, ``numel``), ``t`` and calls ``_init_buckets()``; it supplies ``reduce_bucket`` and
    ``mutable_state``."""

    name = "Bucketed"
    xp: Backend
    meter: CommMeter
    buckets: list[Any]
    t: int

    def __init__(self, options: Any, backend: Backend, buckets: Sequence[Any], meter: CommMeter | None) -> None:
        """The fields every flat-bucket algorithm starts from; one with its own layout (1-bit, SLAMB) sets them
        itself and calls ``_init_buckets``."""
        self.options = options
        self.xp = backend
        self.buckets = list(buckets)
        self.meter = meter if meter is not None else CommMeter()
        self.t = 0
        self._init_buckets()

    def _init_buckets(self) -> None:
        #: Reduce buckets from the face's gradient hooks (``gradient_final``) while backward runs.
        self.overlap = False
        #: Bucket indices in reduction order (the order their reductions start); None: bucket order.
        self.order: list[int] | None = None
        self._reductions: BucketReductions | None = None
        self._position: dict[int, int] = {}  # bucket index -> place in ``order``
        self._pipeline_key: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._done = False  # every bucket of the coming step is reduced (not yet used by ``step``)
        # bucket index -> (the bucket the copies were made for, the copies of its ``mutable_state``)
        self._backups: dict[int, tuple[Any, list[Tensor]]] = {}
        self._backed_up: set[int] = set()  # buckets whose copies hold this step's values
        #: False where the face itself drops a failed step's state (the TF faces step fresh copies, assigned back only
        #: after a step that succeeded): no copies aside then.
        self.keep_backups = True

    # -- what a subclass supplies ------------------------------------------------------------------------
    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i``'s collective for step ``t`` (on the background thread with overlap)."""
        raise NotImplementedError

    def mutable_state(self, seg: Any) -> Sequence[Tensor]:
        """The state buffers of ``seg`` that its collective updates (copied aside before it, restored on failure)."""
        raise NotImplementedError

    #: Why a checkpoint of another bucket layout cannot be loaded (``check_layout``'s message).
    layout_reason = "the per-bucket state cannot be carried over to another layout"

    def rejection_is_the_step(self, t: int) -> bool:
        """Whether a ``UsageError`` of step ``t``'s buckets rejects the step itself (reported as such)."""
        return True

    # -- the buckets of a step ---------------------------------------------------------------------------
    @property
    def launched(self) -> int:
        """Buckets of the coming step whose reduction has started (those started from hooks overlap backward)."""
        return 0 if self._reductions is None else self._reductions.launched

    def _order(self) -> list[int]:
        return self.order if self.order is not None else list(range(len(self.buckets)))

    def _pipeline(self) -> BucketReductions:
        """The in-order launcher of this step's buckets (remade when the face binds other buckets)."""
        order = self._order()
        key = (tuple(order), tuple(len(self.buckets[i].params) for i in order))
        if self._reductions is None or self._pipeline_key != key:
            if sorted(order) != list(range(len(self.buckets))):
                raise ValueError(f"{self.name}: bucket order {order} is not a permutation of the buckets")
            self._reductions = BucketReductions(list(key[1]))
            self._position = {i: b for b, i in enumerate(order)}
            self._pipeline_key = key
        return self._reductions

    def _launch(self, groups: Sequence[dict[str, Any]] | None) -> None:
        """Start the buckets that are ready, with the param groups as they are now, on this (the program's) thread:
        a background reduction reading the live groups would take an lr set after backward on one rank and not
        on another, by timing alone."""
        red = self._pipeline()
        if not red.next_is_ready():  # most hooks: no copy of the groups for nothing
            return
        order, t = self._order(), self.t + 1
        frozen = None if groups is None else [dict(g) for g in groups]
        red.launch_ready(lambda b: self.reduce_bucket(order[b], frozen, t))

    def gradient_final(self, i: int, groups: Sequence[dict[str, Any]], count: int = 1) -> None:
        """From a face's gradient hook: ``count`` more parameters of bucket ``i`` have their final gradient for
        the coming step; each next bucket that is complete starts reducing on the background thread."""
        if self._done:  # a gradient after the step's buckets were reduced: that reduction no longer holds
            self.abandon()
        self._pipeline().mark_ready(self._position[i], count)
        self._launch(groups)

    def reduce_all(self, groups: Sequence[dict[str, Any]] | None) -> None:
        """End of the gradient phase: reduce every bucket not started yet (members without a gradient count as
        final), wait for all; on any rank's failure restore every bucket's state and raise on every rank."""
        red = self._pipeline()
        red.mark_all_ready()
        self._launch(groups)
        try:
            red.drain()
        except Exception as e:
            self._restore()
            if isinstance(e, MismatchError):
                raise self.mismatch_explained(e, groups) from e
            if isinstance(e, UsageError) and self.rejection_is_the_step(self.t + 1):
                raise UsageError(
                    f"{self.name}: step {self.t + 1} rejected on every rank ({e}); step not taken, state unchanged"
                ) from e
            raise
        red.reset()
        self._done = True

    def synchronize(self, groups: Sequence[dict[str, Any]] | None = None) -> None:
        """The gradient phase of the coming step: with overlap, finish the buckets started from the hooks; without
        it leave all to ``step`` (after any edit of ``.grad``)."""
        if self.overlap and not self._done:
            self.reduce_all(groups)

    def consumes_gradients_in_synchronize(self) -> bool:
        """Whether ``synchronize()`` (of the coming step) consumes this rank's gradients as they are, leaving no
        reduced gradient behind that a later edit would act on: with overlap, the buckets read them."""
        return self.overlap

    def writes_gradients(self) -> bool:
        """Whether the coming step's bucket reductions average the gradients in place (a dense warm-up step): code
        between backward and the step must then find the started ones done and act on the averages."""
        return False

    def error_feedback_buffers(self) -> list[Tensor]:
        """This rank's error feedback, in a fixed order: its residual of its own gradients, never another rank's
        (a checkpoint written by another rank starts it from zero; a broadcast of the state leaves it). An
        algorithm without error feedback (SLAMB) has none."""
        return []

    def error_feedback_what(self) -> str:
        """What ``error_feedback_buffers`` holds, in words for a warning."""
        return "error feedback"

    def per_rank_what(self) -> str | None:
        """The state that is each rank's own, in words (for a warning of a resume without it); None: none."""
        return self.error_feedback_what() if self.error_feedback_buffers() else None

    def sharded_moments(self) -> bool:
        """Whether moments are kept for this rank's chunk only, so another rank's are other elements' (hierarchical
        Birder's m and b); none here."""
        return False

    def reset_error_feedback(self) -> None:
        """Start this rank's error feedback from zero; the rest of the state stays."""
        for e in self.error_feedback_buffers():
            self.xp.zero_(e)

    def wait_launched(self) -> None:
        """Wait for the buckets started so far; their errors stay for the step to raise."""
        if self._reductions is not None:
            self._reductions.wait()

    def launched_gradients(self) -> list[Tensor]:
        """The gradients of the buckets started so far for the coming step, in the order they started."""
        return [self.bucket_gradient(i) for i in self._order()[:self.launched]]

    def bucket_gradient(self, i: int) -> Tensor:
        """The gradient buffer that bucket ``i``'s collective reads (and in a warm-up averages)."""
        return self.buckets[i].grad

    def reduce_pending(self, groups: Sequence[dict[str, Any]] | None) -> None:
        """For ``step()``: reduce what is not reduced yet, then keep this step's state (every bucket succeeded)."""
        if not self._done:
            self.reduce_all(groups)
        self._done = False
        self._backed_up.clear()

    def abandon(self) -> None:
        """Drop the coming step's reductions (``zero_grad()`` before ``step()``): wait for those started, then
        restore every bucket's state. Their errors are dropped with them (every rank drops alike)."""
        if self._reductions is not None:
            try:
                self._reductions.drain()
            except Exception:  # the step is discarded, and with it what went wrong in it
                pass
            self._reductions.reset()
        self._restore()
        self._done = False

    def backup(self, i: int) -> None:
        """Copy bucket ``i``'s ``mutable_state`` aside before its collective, when a later bucket may still fail
        (several buckets, or overlap: the step may also be abandoned)."""
        if not self.backs_up():
            return
        seg = self.buckets[i]
        state = list(self.mutable_state(seg))
        kept = self._backups.get(i)
        if kept is None or kept[0] is not seg:
            kept = (seg, [self.xp.zeros_like(s) for s in state])
            self._backups[i] = kept
        for copy, s in zip(kept[1], state, strict=True):
            self.xp.copy_(copy, s)
        self._backed_up.add(i)

    def call_name(self, name: str, i: int | None, groups: Sequence[dict[str, Any]] | None) -> str:
        """``name`` for bucket ``i``'s collective (None: a step's, for all groups), tagged with its param group's
        hyper-parameters (``agreement.tagged``): ranks whose hyper-parameters differ raise MismatchError on every
        rank (``mismatch_explained`` says why). Without ``groups`` the name is left as it is."""
        if groups is None:
            return name
        return agreement.tagged(name, groups if i is None else [groups[self.buckets[i].group]], HYPER_KEYS,
                                self.call_details())

    def call_details(self) -> dict[str, Any]:
        """What a call name's details hold beside the hyper-parameters: the op and its options, which must be the
        same on every rank (``agreement.tagged``): ranks that differ there raise MismatchError naming them."""
        options = self.options
        fields = dataclasses.fields(options) if dataclasses.is_dataclass(options) else ()
        return {"op": self.name, **{f.name: getattr(options, f.name) for f in fields}}

    def mismatch_explained(self, e: MismatchError, groups: Sequence[dict[str, Any]] | None) -> MismatchError:
        """``e`` (raised on every rank), with this rank's hyper-parameters where the names differed."""
        return agreement.mismatch_explained(e, self.name, groups, HYPER_KEYS)

    def check_owner(self, ours: Any) -> None:
        """ValueError if ``ours`` (a checkpoint's section) is not this algorithm's, naming the op that wrote it."""
        if not isinstance(ours, dict) or ours.get("algorithm") != self.name:
            raise ValueError(f"{self.name}.load_state_dict: the checkpoint is for {checkpoint_op(ours)}, not "
                             f"op={self.name}")

    def committed_state_dict(self) -> dict[str, Any]:
        """``state_dict()`` as of the last step taken. A step under way (its buckets reduced during backward, with
        overlap, or by ``synchronize()``) has already changed those buckets' state (moments, errors) in place, so
        a checkpoint taken before ``step()`` would hold half a step; their copies from before (``backup``) stand
        in, and a resume takes the whole step again."""
        self.wait_launched()  # no bucket still writing its state
        reduced = sorted(self._backed_up)
        self._swap_backups(reduced)
        try:
            return self.state_dict()
        finally:
            self._swap_backups(reduced)

    def _swap_backups(self, buckets: Sequence[int]) -> None:
        for i in buckets:
            seg, copies = self._backups[i]
            for s, copy in zip(self.mutable_state(seg), copies, strict=True):
                held = self.xp.copy_(self.xp.zeros_like(s), s)
                self.xp.copy_(s, copy)
                self.xp.copy_(copy, held)

    def backs_up(self) -> bool:
        """Whether ``backup`` keeps copies: not for one bucket without overlap, whose state the core leaves as it
        was on rejection."""
        return self.keep_backups and (len(self.buckets) > 1 or self.overlap)

    def _restore(self) -> None:
        """Every bucket's state back to its copy of this step (those reduced this step have one)."""
        for i in sorted(self._backed_up):
            seg, copies = self._backups[i]
            for s, copy in zip(self.mutable_state(seg), copies, strict=True):
                self.xp.copy_(s, copy)
        self._backed_up.clear()

    # -- checkpoints ---------------------------------------------------------------------------------
    def check_plain_step(self, t: int, key: str) -> None:
        """ValueError if a checkpoint without this algorithm's section ``key`` (a plain optimizer's, at step ``t``)
        cannot start the algorithm there; every step can by default."""

    @staticmethod
    def layout_state(seg: Any) -> dict[str, Any]:
        """The bucket's layout in a checkpoint: its elements, param group and the elements of each parameter."""
        return {"numel": seg.numel, "group": seg.group, "sizes": list(seg.sizes)}

    def check_layout(self, saved: Sequence[dict[str, Any]]) -> None:
        """ValueError, before anything changes, if the checkpoint's buckets ``saved`` are cut otherwise."""
        what = f"{self.name}.load_state_dict"
        want = [seg.numel for seg in self.buckets]
        if [s.get("numel") for s in saved] != want:
            raise ValueError(
                f"{what}: fused buffer sizes {[s.get('numel') for s in saved]} != this model's {want} (the buckets "
                f"are the buckets of each param group and dtype: another model, param groups or bucket_mb; "
                f"{self.layout_reason})"
            )
        # A checkpoint without the layout has one bucket per param group (and dtype); it loads where that is also
        # one bucket here (equal sizes above), since then the per-bucket state means the same.
        layout = [(s.get("group", seg.group), list(s.get("sizes", seg.sizes)))
                  for s, seg in zip(saved, self.buckets, strict=True)]
        if layout != [(seg.group, list(seg.sizes)) for seg in self.buckets]:
            raise ValueError(
                f"{what}: the checkpoint's buckets (param group, parameter sizes) {layout} differ from this "
                f"optimizer's {[(seg.group, list(seg.sizes)) for seg in self.buckets]} (another bucket_mb or model?)"
            )
