"""The engine of ``hc.DistributedOptimizer(op=hc.Average | hc.Sum)``: Horovod's gradient reduction, in buckets.

The gradients live in fused buffers (``FusedGradients``), cut into buckets: contiguous slices of a buffer planned by
``hvd_compress.ops.buckets.plan_buckets`` from the parameters in reverse registration order (the order backward makes
them final), each closed at ``bucket_mb``. Every bucket is one allreduce call. With overlap (the default) the gradient
hook of the last member of a bucket starts its allreduce on the background thread while backward continues, and the
end of the backward pass waits for them (as DDP's); buckets start strictly in bucket order, so every rank issues the
same calls in the same order. ``synchronize()`` starts what is left (parameters without a gradient this step count as
zeros, as in Horovod) and waits for all. Without overlap it issues the same calls on the same slices after backward:
the two give bit-identical results.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.algorithms import agreement
from hvd_compress.ops import process_sets
from hvd_compress.ops.buckets import (
    DEFAULT_BUCKET_MB,
    FIRST_BUCKET_MB,
    BucketReductions,
    failure_joins_as_rejection,
    plan_buckets,
)
from hvd_compress.ops.collectives import check_predivide, reject_allreduce
from hvd_compress.ops.compression import Compression, Compressor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import MismatchError, UsageError
from hvd_compress.ops.horovod_args import NOTE, pop_horovod_defaults
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.compression import CompressionState
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce_
from hvd_compress.torch.fused import FusedGradients
from hvd_compress.torch.sparse import sparse_allreduce
from hvd_compress.torch.wrapping import (
    HELD_BACK,
    STATE_KEY,
    Engine,
    any_rank_nonfinite,
    at_end_of_backward,
    check_named_parameters,
    closure_loss,
    compose,
    hook_gradients,
    own_section,
)

#: What op=Average/Sum take beside Horovod's arguments at their defaults (and which of those they interpret).
_DENSE_OPTIONS = ["compression", "gradient_predivide_factor", "sparse_as_dense", "overlap", "bucket_mb"]
_DENSE_HOROVOD = ("gradient_predivide_factor", "sparse_as_dense")


class DenseEngine(Engine):
    """op=Average/Sum: reduce the gradients in buckets, then step the wrapped optimizer."""

    exports = ("overlap",)
    amp_scaling = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base: type,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        op: ReduceOp,
        backward_passes_per_step: int,
        gradient_predivide_factor: float = 1.0,
        sparse_as_dense: bool = False,
        compression: Compressor = Compression.none,
        overlap: bool = True,
        bucket_mb: float = DEFAULT_BUCKET_MB,
        process_set: Any = None,
    ) -> None:
        super().__init__(optimizer, base)
        self.process_set = process_set  # resolved: None for the world
        self.member = process_sets.includes_me(process_set)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.names = check_named_parameters(params, named_parameters)
        self.op = op
        self.predivide = float(gradient_predivide_factor)
        self.grads = FusedGradients(params)
        self.passes = PassCounter(self.grads.params, backward_passes_per_step)
        self.meter = CommMeter()
        # Without sparse_as_dense, a sparse gradient stays sparse (Horovod's allgather); with it, it accumulates
        # into its dense view like any other gradient (and is noted, for SparseAdam: see synchronize).
        before = self.grads.note_densified if sparse_as_dense else self.grads.keep_sparse
        hook_gradients(self.grads.params, self.count_pass, before)
        # compression=: one error-feedback state per fused buffer (top-k/random-k), in state_dict(). Top-k
        # selects over the whole buffer, not per parameter as Horovod's per-tensor compressors would (which
        # trained worse in tests/test_compression_fidelity.py; hc.CompressionState(sizes=...) gives the
        # per-tensor rule to the collective).
        self.compression = compression
        self.cstates = [
            CompressionState(flat.numel(), compression, device=flat.device) if compression.stateful else None
            for flat in self.grads.buffers
        ]
        # A stateful compressor's selection and error feedback are per whole buffer (and so is its checkpoint):
        # each buffer is one bucket, reduced in step(). Every other reduction is element-wise, so buckets apply.
        grads = self.grads.params
        if compression.stateful:
            plan = [[i for i, p in enumerate(grads) if self.grads.span([p])[0] == b]
                    for b in range(len(self.grads.buffers))]
        else:
            cap = int(bucket_mb * (1 << 20))
            items = [((p.dtype, p.device), p.numel() * p.element_size()) for p in grads]
            plan = plan_buckets(items, cap, min(cap, int(FIRST_BUCKET_MB * (1 << 20))))
        self._overlap = bool(overlap)
        self.buckets = [self.grads.span([grads[i] for i in members]) for members in plan]
        self.bucket_of = {id(grads[i]): b for b, members in enumerate(plan) for i in members}
        self.reductions = BucketReductions([len(members) for members in plan])
        self.reduced_in_step = False
        self._tag: str | None = None  # the step's hyper-parameter tag (``_launch_ready``), once it has one

    def count_pass(self, p: torch.Tensor) -> None:
        passes = self.passes.add(p)
        self.protocol.synchronized = False  # a new gradient after synchronize() needs reducing again
        if self._overlap and passes == self.passes.limit:
            ensure_init()
            self.grads.gather_one(p)  # a .grad set from outside (model.zero_grad()) into its view
            self.reductions.mark_ready(self.bucket_of[id(p)])
            if self._launch_ready():
                if self.reductions.launched == len(self.buckets):
                    # The end of a nested backward (reentrant activation checkpointing: its own graph task, its own
                    # callbacks) may have found buckets held back that this outer pass has now started.
                    self.protocol.remember_backward([])
                at_end_of_backward(self)

    def end_of_backward(self) -> None:
        """Once the backward pass that started buckets is over: wait for them, as DDP's backward does, so that
        ``.grad`` holds the reduced gradients when ``backward()`` returns. The buckets still overlap the rest of the
        backward pass; what no longer overlaps them is the user's code between ``backward()`` and ``step()``, which
        may now read and change ``.grad`` (torch's AMP recipe, ``scaler.unscale_(opt)`` then clipping, would
        otherwise unscale buckets while they are reduced in place). Errors stay for ``synchronize()`` to raise on
        every rank. A parameter without a gradient in this pass holds back its bucket and the later ones until
        ``synchronize()``: see ``note_held_back``."""
        self.reductions.wait()
        self.note_held_back()

    def note_held_back(self) -> None:
        """At the end of a backward pass: where some buckets are reduced and later ones still hold this rank's own
        gradients (held back by a parameter without a gradient), remember the reduced ones (launched in bucket
        order). A change of them before ``synchronize()`` (torch's recipe: clipping by this rank's norm over
        averaged and local gradients alike) would step the ranks apart; ``synchronize()`` refuses it instead."""
        launched = self.reductions.launched
        held_back = 0 < launched < len(self.buckets)
        self.protocol.remember_backward([self.buckets[b][1] for b in range(launched)] if held_back else [])

    def _launch_ready(self) -> int:
        """Start each next bucket that is ready (``reduce_bucket`` on the background thread); how many. Their
        names carry the wrapped optimizer's param groups as they are when the step's first bucket
        starts, taken on this (the program's) thread (``agreement.tagged``) once per step (its cost grows with the
        number of param groups): ranks whose hyper-parameters differ would step apart on the same averaged
        gradients, and raise MismatchError on every rank instead, before any data moves."""
        if not self.reductions.next_is_ready():
            return 0
        if self._tag is None:
            self._step_starts()
            self._tag = agreement.tagged("", self.opt.param_groups, call={"op": self.op_name})
        tag = self._tag
        return self.reductions.launch_ready(lambda b: self.reduce_bucket(b, tag))

    def _step_starts(self) -> None:
        """The step's first bucket is about to start, on the program's thread (again after a refused step)."""

    def reduce_bucket(self, index: int, tag: str) -> None:
        """One bucket's allreduce (on the background thread), its name ending in ``tag``. A failure before the core
        call is this rank's alone: it joins the call as a rejection, so the other ranks raise too instead of
        waiting for it. Outside the optimizer's process set there is no call."""
        if not self.member:
            return
        self.reduced_in_step = True  # a stateful reduction's state is now this step's (check_between_steps)
        with process_sets.scope(self.process_set):
            self._allreduce_bucket(index, tag)

    def _allreduce_bucket(self, index: int, tag: str) -> None:
        buffer, flat = self.buckets[index]
        f = self.predivide
        # Horovod's split average with a predivide factor: 1/f before the sum, f/size after it.
        op, pre, post = (self.op, 1.0, 1.0) if f == 1.0 else (ReduceOp.Sum, 1.0 / f, f / ops.size())
        name = f"DistributedOptimizer.grad.{index}{tag}"
        with failure_joins_as_rejection(self.meter, name):
            self.meter.run(allreduce_, flat, op=op, name=name, prescale_factor=pre, postscale_factor=post,
                           compression=self.compression, state=self.cstates[buffer])

    def synchronize(self) -> None:
        """Reduce the accumulated gradients over all ranks (of the process set) into ``.grad`` (step() calls this
        unless it runs inside ``skip_synchronize()``): clip or inspect the reduced gradients between the two.

        With overlap, the buckets whose gradients were final during backward were reduced in place by the time
        ``backward()`` returned (``end_of_backward``); with ``overlap=False`` nothing is reduced before this call.
        An error in any rank's reduction raises here on every rank, after every started bucket has finished."""
        ensure_init()
        if not self.member:  # outside the process set: this rank's own gradients, as in Horovod
            self.check_momentum()
            self.reductions.drain()
            self.reductions.reset()
            self.grads.gather()
            self.passes.reset()
            self.protocol.mark_synchronized()
            return
        with process_sets.scope(self.process_set):
            self._synchronize_members()

    def _synchronize_members(self) -> None:
        try:
            self.check_momentum()
        except ValueError as e:
            self.reject_reductions(f"{type(e).__name__}: {e}")
            raise
        self.grads.gather()  # only touches gradients that are not their views yet (none already reducing)
        if self.protocol.changed_since_backward():
            # This rank's held-back buckets join their allreduces as rejections: every other rank raises too,
            # with no collective added to the steps that change nothing (a rank that edited holds some back). The
            # peers get the gist (a rejection's reason travels cut to fit).
            name = self.wrapper_name
            self.reject_reductions(f"UsageError: {name}: .grad changed after backward() while buckets were held "
                                   "back; call opt.synchronize() before changing .grad")
            raise UsageError(HELD_BACK.format(name=name, until="synchronize()"))
        self.reductions.mark_all_ready()
        self._launch_ready()
        try:
            self.reductions.drain()
        except Exception as e:
            self.passes.reset()
            self._tag = None  # the next try reads the groups again
            if isinstance(e, MismatchError):
                raise agreement.mismatch_explained(e, self.wrapper_name, self.opt.param_groups) from e
            raise
        self.reductions.reset()
        sparse = self.grads.sparse
        tag = (self._tag or agreement.tagged("", self.opt.param_groups, call={"op": self.op_name})) if sparse else ""
        for p in self.grads.params:  # in parameter order: the same order on every rank
            if id(p) in sparse:
                name = f"DistributedOptimizer.sparse.{self.names.get(id(p), '?')}{tag}"
                try:
                    p.grad = self.meter.run(sparse_allreduce, p.grad, p, sparse[id(p)], self.op, name)
                except MismatchError as e:
                    raise agreement.mismatch_explained(e, self.wrapper_name, self.opt.param_groups) from e
        if isinstance(self.opt, torch.optim.SparseAdam):  # takes sparse gradients only; any other gets them dense
            self.grads.resparsify()
        self.passes.reset()
        self.protocol.mark_synchronized()

    @property
    def op_name(self) -> str:
        """The op as the user named it, for messages."""
        return self.op.name

    @property
    def wrapper_name(self) -> str:
        """The wrapper with its op as the user named it, for messages."""
        return f"DistributedOptimizer(op={self.op_name})"

    @property
    def overlap(self) -> bool:
        """Whether gradient buckets are reduced during backward (``overlap=`` of ``DistributedOptimizer``)."""
        return self._overlap

    def check_momentum(self) -> None:
        """The construction-time DGC guard again, for a momentum given to the wrapped optimizer later (a param
        group's ``momentum`` set; a group added is refused before, ``Engine.check_param_groups``). Cheap and local,
        run before this rank's reductions of the step; ``synchronize()`` makes a failure every rank's
        (``reject_reductions``)."""
        check_no_second_momentum(self.opt, self.compression,
                                 " (given after DistributedOptimizer was built; this call changed nothing)")

    def reject_reductions(self, why: str) -> None:
        """This rank cannot take the step (``why``): each bucket not started yet joins its allreduce as a rejection,
        in bucket order, so every other rank raises ``RejectedInputError`` from ``synchronize()`` instead of
        waiting for calls that never come (a momentum set on one rank only); those started from the hooks finish.
        The gradients and the compression state stay as they were (a rejected call changes nothing)."""
        red = self.reductions
        red.mark_all_ready()
        red.launch_ready(lambda b: self.meter.run(reject_allreduce, why, f"DistributedOptimizer.grad.{b}"))
        try:
            red.drain()
        except Exception:  # this rank's own rejections: the caller raises the reason itself
            pass
        red.reset()
        self.passes.reset()

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        """The wrapped optimizer's step on the reduced gradients. With ``scaler.step(opt)`` (torch's GradScaler hands
        itself here) the gradients are unscaled before they are reduced where none is reduced during backward
        (``overlap=False``), else once every bucket has landed (never while the background thread reduces
        them in place), and the step is skipped on every rank if any rank's held an inf/NaN (the verdict
        written back into each scaler, so every rank's ``scaler.update()`` moves its scale alike). A closure runs
        first, as the other ops' (the gradients it computes are the ones reduced; Horovod's wrapper reduces before
        calling it and the wrapped optimizer then steps on unreduced gradients); its loss is returned."""
        loss = closure_loss(closure)
        if self.protocol.skip or self.protocol.synchronized:  # no reduction left in this step: the check is this
            self.check_momentum()  # rank's (inside skip_synchronize(), synchronize() ran before the change)
        if self.protocol.for_step():  # else synchronize() checks, and a failure joins every rank's
            if grad_scaler is not None and not self._overlap:
                # Nothing is reduced before this call (overlap=False, top-k/random-k): unscale and agree first, so
                # that a skipped step leaves the error feedback as it was and the reduction sees unscaled gradients.
                # Decided by the options, alike on every rank (how many buckets backward started is not: the
                # agreement must come at the same place in every rank's sequence of collectives).
                skip = any_rank_nonfinite(grad_scaler, self.opt, "DistributedOptimizer.found_inf")
                if skip:
                    self.reductions.reset()
                    self.passes.reset()
                    self._end_step()
                    return loss
                grad_scaler = None  # agreed: the verdict is in every rank's scaler
            self.synchronize()
        if grad_scaler is not None and any_rank_nonfinite(grad_scaler, self.opt, "DistributedOptimizer.found_inf"):
            self._end_step()
            return loss
        self.base.step(self.opt)
        self._end_step()
        return loss

    def _end_step(self) -> None:
        """The step is taken, skipped or dropped (``zero_grad()``)."""
        self.protocol.step_done()
        self.reduced_in_step = False
        self._tag = None

    def check_between_steps(self) -> None:
        """``state_dict()`` of a reduction with state (top-k/random-k's error feedback, PowerSGD's error, P and Q)
        warns where the step under way has reduced buckets (during backward, or in ``synchronize()``): their
        state is already this step's, the parameters' not, so a checkpoint would hold half a step. No copy of the
        state from before is kept (for PowerSGD it would be a second error buffer of the model's size), and a look
        at the state there (tests do) is no checkpoint: a warning, not an error."""
        if self.reduced_in_step:
            warnings.warn(f"{self.wrapper_name}.state_dict(): the step under way has reduced buckets and changed "
                          "their error feedback (PowerSGD: and P and Q), the parameters not yet: a checkpoint now "
                          "holds half a step, and a resume from it would not repeat the run. Take it after step() "
                          "(or zero_grad())", stacklevel=3)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers; ``.grad`` becomes None (torch's default), or with ``set_to_none=False``
        stays a zeroed view of them, which saves a copy per step. The count of backward passes starts again: a
        pass whose gradients are dropped here does not count (a GAN's generator step also fills the
        discriminator's gradients, which its next ``zero_grad()`` drops)."""
        self.reductions.drain()  # never zero a bucket that is still being reduced
        self.reductions.reset()
        self.grads.zero_(set_to_none)
        self.zero_untracked_grads(set_to_none)
        self.passes.reset()
        self._end_step()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state, plus (top-k/random-k) this rank's error feedback and step."""
        if self.compression.stateful:
            self.check_between_steps()
        out = self.base.state_dict(self.opt)
        if self.compression.stateful:
            out[STATE_KEY] = own_section({"compression": self.compression.describe(),
                                          "buffers": [st.state_dict() for st in self.cstates]})
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (each rank its own: the error feedback is per rank). One without the
        compression section (a plain torch checkpoint) restarts the error feedback from zero."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        stateful = self.compression.stateful
        if stateful and ours is not None:  # check everything before changing anything
            want = self.compression.describe()
            if ours.get("compression") != want or len(ours.get("buffers", ())) != len(self.cstates):
                raise ValueError(
                    f"load_state_dict: the checkpoint's compression is {ours.get('compression')!r} over "
                    f"{len(ours.get('buffers', ()))} buffer(s); this optimizer has {want!r} over "
                    f"{len(self.cstates)}"
                )
            for st, saved in zip(self.cstates, ours["buffers"], strict=True):
                st.check_state_dict(saved)
        self.base.load_state_dict(self.opt, state_dict)
        if stateful:
            for i, st in enumerate(self.cstates):
                if ours is None:
                    st.reset()
                    st.step = 0
                else:
                    st.load_state_dict(ours["buffers"][i])
            # the error and the DGC velocity; the step stays
            self.drop_another_ranks_error_feedback(ours, self.wrapper_name)

    def error_feedback(self) -> list[torch.Tensor]:
        """Top-k/random-k's error and DGC velocity per buffer."""
        return [t for st in self.cstates if st is not None for t in (st.error, st.velocity) if t is not None]

    @classmethod
    def wrap(cls, optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
             options: dict[str, Any]) -> torch.optim.Optimizer:
        """Validate op=Average/Sum's options and wrap ``optimizer``."""
        options = dict(options)
        pop_horovod_defaults(options, f"DistributedOptimizer(op={op.name})", _DENSE_HOROVOD, _DENSE_OPTIONS)
        predivide = options.pop("gradient_predivide_factor", 1.0)
        sparse_as_dense = bool(options.pop("sparse_as_dense", False))
        compression = options.pop("compression", Compression.none)
        process_set = options.pop("process_set", None)
        overlap = options.pop("overlap", None)
        bucket_mb = options.pop("bucket_mb", DEFAULT_BUCKET_MB)
        if options:
            raise TypeError(f"op={op.name} got unknown options {sorted(options)}; it takes "
                            f"{', '.join(_DENSE_OPTIONS)}, {NOTE}")
        check_predivide(predivide, op)
        check_overlap_options(False if overlap is None else overlap, bucket_mb)
        if overlap and compression.stateful:
            raise ValueError(
                f"overlap=True does not apply to compression={compression!r}: its selection and error feedback are "
                "per whole buffer, reduced in step() (leave overlap unset)"
            )
        overlap = not compression.stateful if overlap is None else overlap
        check_no_second_momentum(optimizer, compression)
        return compose(optimizer, cls, named_parameters, op, passes, predivide, sparse_as_dense, compression,
                       overlap, bucket_mb, process_set)


def check_no_second_momentum(optimizer: torch.optim.Optimizer, compression: Compressor, when: str = "") -> None:
    """With DGC momentum (``topk(ratio, momentum=mu)``) the reduced gradient already carries the momentum: a
    wrapped optimizer with its own (SGD/RMSprop ``momentum``, Adam's beta1) would apply it a second time.
    ``when``: added to the message (the step-time check says what was not done)."""
    if not compression.momentum:
        return
    for i, group in enumerate(optimizer.param_groups):
        own = group.get("momentum", 0.0) or (group.get("betas") or (0.0,))[0]
        if own:
            raise ValueError(
                f"compression={compression!r} applies momentum {compression.momentum} inside the compression (DGC "
                f"momentum correction); the wrapped {type(optimizer).__name__}'s param_groups[{i}] has its own "
                f"momentum {own}, which would apply it twice: wrap torch.optim.SGD(..., momentum=0){when}"
            )


def check_overlap_options(overlap: Any, bucket_mb: Any) -> None:
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap must be True or False, got {overlap!r}")
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be a positive number of MiB, got {bucket_mb!r}")
