"""``hc.DistributedOptimizer``: Horovod's drop-in optimizer wrapper, on the hvd_compress core."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from hvd_compress import algorithms, ops
from hvd_compress.algorithms import slamb
from hvd_compress.algorithms.adasum_delta import AdasumOptions
from hvd_compress.algorithms.birder import parse_options as parse_birder_options
from hvd_compress.algorithms.onebit import parse_options
from hvd_compress.algorithms.options import build_options, option_names
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
from hvd_compress.ops.compression import resolve as resolve_compression
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import ProcessSetError
from hvd_compress.ops.horovod_args import NOTE, pop_horovod_defaults
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.adasum_optimizer import AdasumMixin
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.birder import Birder, BirderMixin, check_birder
from hvd_compress.torch.compression import CompressionState
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce_
from hvd_compress.torch.fused import FusedGradients
from hvd_compress.torch.onebit_optimizer import OneBitMixin, check_adam, check_lamb
from hvd_compress.torch.slamb_optimizer import SlambMixin
from hvd_compress.torch.slamb_optimizer import check_lamb as check_slamb_lamb
from hvd_compress.torch.sparse import sparse_allreduce
from hvd_compress.torch.wrapping import (
    STATE_KEY,
    SynchronizeProtocol,
    check_named_parameters,
    hook_gradients,
    rewrap,
)


def _on_process_set(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``'s collectives run on the optimizer's process set (``process_set=``); on a rank outside it, none
    run (``synchronize`` leaves its gradients local, as Horovod's optimizer does there)."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._hvdc_member:
            return method(self, *args, **kwargs)
        with process_sets.scope(self._hvdc_process_set):
            return method(self, *args, **kwargs)

    return run


class _DistributedMixin(SynchronizeProtocol):
    """Methods added to the wrapped optimizer's class for op=Average/Sum.

    The gradients live in fused buffers (``FusedGradients``), cut into buckets: contiguous slices of a buffer
    planned by ``hvd_compress.ops.buckets.plan_buckets`` from the parameters in reverse registration order (the
    order backward makes them final), each closed at ``bucket_mb``. Every bucket is one allreduce call. With
    overlap (the default) the gradient hook of the last member of a bucket starts its allreduce on the
    background thread while backward continues; buckets start strictly in bucket order, so every rank issues
    the same calls in the same order. ``synchronize()`` starts what is left (parameters without a gradient this
    step count as zeros, as in Horovod) and waits for all. Without overlap it issues the same calls on the same
    slices after backward: the two give bit-identical results."""

    def _hvdc_setup(
        self,
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
        params = [p for g in self.param_groups for p in g["params"]]
        names = check_named_parameters(params, named_parameters)
        self._hvdc_process_set = process_set  # resolved: None for the world
        self._hvdc_member = process_sets.includes_me(process_set)
        self._hvdc_op = op
        self._hvdc_predivide = float(gradient_predivide_factor)
        self._hvdc_grads = FusedGradients(params)
        self._hvdc_passes = PassCounter(self._hvdc_grads.params, backward_passes_per_step)
        self._hvdc_meter = CommMeter()
        self._hvdc_names = names
        # Without sparse_as_dense, a sparse gradient stays sparse (Horovod's allgather); with it, it accumulates
        # into its dense view like any other gradient (and is noted, for SparseAdam: see synchronize).
        before = self._hvdc_grads.note_densified if sparse_as_dense else self._hvdc_grads.keep_sparse
        hook_gradients(self._hvdc_grads.params, self._hvdc_count_pass, before)
        # compression=: one error-feedback state per fused buffer (top-k/random-k), in state_dict(). Top-k
        # selects over the whole buffer, not per parameter as Horovod's per-tensor compressors would: on the
        # fidelity task (tests/test_compression_fidelity.py, seed 1) global top-k 1% ended +0.3% off dense SGD,
        # per parameter +13.9% (hc.CompressionState(sizes=...) gives the per-tensor rule to the collective).
        self._hvdc_compression = compression
        self._hvdc_cstates = [
            CompressionState(flat.numel(), compression, device=flat.device) if compression.stateful else None
            for flat in self._hvdc_grads.buffers
        ]
        # A stateful compressor's selection and error feedback are per whole buffer (and so is its checkpoint):
        # each buffer is one bucket, reduced in step(). Every other reduction is element-wise, so buckets apply.
        grads = self._hvdc_grads.params
        if compression.stateful:
            plan = [[i for i, p in enumerate(grads) if self._hvdc_grads.span([p])[0] == b]
                    for b in range(len(self._hvdc_grads.buffers))]
        else:
            cap = int(bucket_mb * (1 << 20))
            items = [((p.dtype, p.device), p.numel() * p.element_size()) for p in grads]
            plan = plan_buckets(items, cap, min(cap, int(FIRST_BUCKET_MB * (1 << 20))))
        self._hvdc_overlap = bool(overlap)
        self._hvdc_buckets = [self._hvdc_grads.span([grads[i] for i in members]) for members in plan]
        self._hvdc_bucket_of = {id(grads[i]): b for b, members in enumerate(plan) for i in members}
        self._hvdc_reductions = BucketReductions([len(members) for members in plan])

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        passes = self._hvdc_passes.add(p)
        self._hvdc_synchronized = False  # a new gradient after synchronize() needs reducing again
        if self._hvdc_overlap and passes == self._hvdc_passes.limit:
            ensure_init()
            self._hvdc_grads.gather_one(p)  # a .grad set from outside (model.zero_grad()) into its view
            self._hvdc_reductions.mark_ready(self._hvdc_bucket_of[id(p)])
            self._hvdc_reductions.launch_ready(self._hvdc_reduce_bucket)

    @_on_process_set
    def _hvdc_reduce_bucket(self, index: int) -> None:
        """One bucket's allreduce (on the background thread). A failure before the core call is this rank's
        alone: it joins the call as a rejection, so the other ranks raise too instead of waiting for it."""
        if not self._hvdc_member:
            return
        buffer, flat = self._hvdc_buckets[index]
        f = self._hvdc_predivide
        # Horovod's split average with a predivide factor: 1/f before the sum, f/size after it.
        op, pre, post = (self._hvdc_op, 1.0, 1.0) if f == 1.0 else (ReduceOp.Sum, 1.0 / f, f / ops.size())
        name = f"DistributedOptimizer.grad.{index}"
        with failure_joins_as_rejection(self._hvdc_meter, name):
            self._hvdc_meter.run(allreduce_, flat, op=op, name=name, prescale_factor=pre, postscale_factor=post,
                                 compression=self._hvdc_compression, state=self._hvdc_cstates[buffer])

    @_on_process_set
    def synchronize(self) -> None:
        """Reduce the accumulated gradients over all ranks (of the process set) into ``.grad`` (step() calls this
        unless it runs inside ``skip_synchronize()``): clip or inspect the reduced gradients between the two.

        With overlap, the buckets whose gradients were final during backward are already being reduced in
        place: change ``.grad`` only after ``synchronize()`` (as with Horovod), or pass ``overlap=False``. An
        error in any rank's reduction raises here on every rank, after every started bucket has finished."""
        ensure_init()
        if not self._hvdc_member:  # outside the process set: this rank's own gradients, as in Horovod
            self._hvdc_check_momentum()
            self._hvdc_reductions.drain()
            self._hvdc_reductions.reset()
            self._hvdc_grads.gather()
            self._hvdc_passes.reset()
            self._hvdc_mark_synchronized()
            return
        try:
            self._hvdc_check_momentum()
        except ValueError as e:
            self._hvdc_reject_reductions(f"{type(e).__name__}: {e}")
            raise
        self._hvdc_grads.gather()  # only touches gradients that are not their views yet (none already reducing)
        self._hvdc_reductions.mark_all_ready()
        self._hvdc_reductions.launch_ready(self._hvdc_reduce_bucket)
        try:
            self._hvdc_reductions.drain()
        except Exception:
            self._hvdc_passes.reset()
            raise
        self._hvdc_reductions.reset()
        sparse = self._hvdc_grads.sparse
        for p in self._hvdc_grads.params:  # in parameter order: the same order on every rank
            if id(p) in sparse:
                name = f"DistributedOptimizer.sparse.{self._hvdc_names.get(id(p), '?')}"
                p.grad = self._hvdc_meter.run(sparse_allreduce, p.grad, p, sparse[id(p)], self._hvdc_op, name)
        if isinstance(self, torch.optim.SparseAdam):  # takes sparse gradients only; any other gets them dense
            self._hvdc_grads.resparsify()
        self._hvdc_passes.reset()
        self._hvdc_mark_synchronized()

    @property
    def overlap(self) -> bool:
        """Whether gradient buckets are reduced during backward (``overlap=`` of ``DistributedOptimizer``)."""
        return self._hvdc_overlap

    def _hvdc_check_momentum(self) -> None:
        """The construction-time DGC guard again, for a momentum given to the wrapped optimizer later (a param
        group's ``momentum`` set, ``add_param_group``). Cheap and local, run before this rank's reductions of the
        step; ``synchronize()`` makes a failure every rank's (``_hvdc_reject_reductions``)."""
        _check_no_second_momentum(self, self._hvdc_compression,
                                  " (given after DistributedOptimizer was built; this call changed nothing)")

    def _hvdc_reject_reductions(self, why: str) -> None:
        """This rank cannot take the step (``why``): each bucket not started yet joins its allreduce as a rejection,
        in bucket order, so every other rank raises ``RejectedInputError`` from ``synchronize()`` instead of
        waiting for calls that never come (a momentum set on one rank only); those started from the hooks finish.
        The gradients and the compression state stay as they were (a rejected call changes nothing)."""
        red = self._hvdc_reductions
        red.mark_all_ready()
        red.launch_ready(lambda b: self._hvdc_meter.run(reject_allreduce, why, f"DistributedOptimizer.grad.{b}"))
        try:
            red.drain()
        except Exception:  # this rank's own rejections: the caller raises the reason itself
            pass
        red.reset()
        self._hvdc_passes.reset()

    def step(self, closure: Any = None) -> Any:
        if self._hvdc_skip or self._hvdc_synchronized:  # no reduction left in this step: the check is this rank's
            self._hvdc_check_momentum()  # (inside skip_synchronize(), synchronize() ran before the change)
        self._hvdc_synchronize_for_step()  # else synchronize() checks, and a failure joins every rank's calls
        out = super(self.__class__, self).step(closure)
        self._hvdc_step_done()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers in place (gradients stay views, never None)."""
        del set_to_none  # views must survive for the fused reduction
        self._hvdc_reductions.drain()  # never zero a bucket that is still being reduced
        self._hvdc_reductions.reset()
        self._hvdc_grads.zero_()
        self._hvdc_step_done()

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self._hvdc_meter.take()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state, plus (top-k/random-k) this rank's error feedback and step."""
        out = super(self.__class__, self).state_dict()
        if getattr(self, "_hvdc_compression", Compression.none).stateful:
            out[STATE_KEY] = {"compression": self._hvdc_compression.describe(),
                              "buffers": [st.state_dict() for st in self._hvdc_cstates]}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (each rank its own: the error feedback is per rank). One without the
        compression section (a plain torch checkpoint) restarts the error feedback from zero."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        stateful = getattr(self, "_hvdc_compression", Compression.none).stateful
        if stateful and ours is not None:  # check everything before changing anything
            want = self._hvdc_compression.describe()
            if ours.get("compression") != want or len(ours.get("buffers", ())) != len(self._hvdc_cstates):
                raise ValueError(
                    f"load_state_dict: the checkpoint's compression is {ours.get('compression')!r} over "
                    f"{len(ours.get('buffers', ()))} buffer(s); this optimizer has {want!r} over "
                    f"{len(self._hvdc_cstates)}"
                )
            for st, saved in zip(self._hvdc_cstates, ours["buffers"], strict=True):
                st.check_state_dict(saved)
        super(self.__class__, self).load_state_dict(state_dict)
        if stateful:
            for i, st in enumerate(self._hvdc_cstates):
                if ours is None:
                    st.reset()
                    st.step = 0
                else:
                    st.load_state_dict(ours["buffers"][i])


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
    op: Any = ReduceOp.Average,
    backward_passes_per_step: int = 1,
    *,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    **algorithm_options: Any,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for data-parallel training over all ranks.

    - ``op=hc.Average``/``hc.Sum``: the gradients are reduced in buckets of ``bucket_mb`` MiB (default 25; the
      first bucket 1 MiB), then ``step()`` steps the wrapped optimizer, as ``hvd.DistributedOptimizer``. With
      ``overlap=True`` (the default) a bucket's allreduce starts on a background thread as soon as backward has
      made its gradients final, so communication overlaps the rest of backward; ``step()`` (``synchronize()``)
      waits for all. ``overlap=False`` issues the same calls after backward: results are bit-identical either
      way. With overlap, change ``.grad`` only after ``synchronize()`` (Horovod's rule); top-k/random-k
      ``compression=`` reduce whole buffers in ``step()`` (no overlap); sparse gradients are gathered in
      ``step()``. Gradients of parameters registered in the reverse of the order backward reaches them
      still reduce correctly, with less overlap.
    - ``op=hc.Adasum``: each rank steps on its own gradient and the parameter deltas are Adasum-reduced
      (see ``hvd_compress.torch.adasum_optimizer``); options ``hierarchical``, ``grad_scaler``, ``bucket_mb``.
    - ``op=hc.OneBitAdam`` (wraps ``torch.optim.Adam``/``AdamW``) and ``op=hc.OneBitLamb`` (wraps
      ``hc.Lamb``): dense warm-up for ``freeze_step`` steps, then 1-bit compressed momentum (see
      ``hvd_compress.torch.onebit_optimizer``), in buckets of ``bucket_mb`` MiB (as Average's; each bucket keeps
      its own error feedback) reduced during backward with ``overlap=True`` (the default; ``overlap=False``: after
      it, bit-identical results; with overlap a ``.grad`` edited after ``synchronize()`` is reduced again in
      ``step()``: the compression stage's momentum is formed in the gradient hook); ``variance_floor`` (default
      0.01: each layer's frozen variance at least that fraction of the larger of its mean and 1% of its bucket's,
      which trains ReLU networks and biases before BatchNorm; 0: the papers' exact rule);
      LAMB options ``coeff_beta``, ``factor_min``, ``factor_max``, ``factor_threshold``; ``hierarchical=True``:
      the compressed momentum goes through the Hierarchical-1-bit-All-Reduce (paper 004 Section 4).
    - ``op=hc.SLAMB`` (wraps ``hc.Lamb``): random-k masked momentum averaging with local error compensation and
      a dense parameter average every ``sync_interval`` steps (see ``hvd_compress.torch.slamb_optimizer``);
      options ``compress_ratio``, ``sync_interval``, ``beta3``, ``seed``, ``mask``, ``grad_size_thr``,
      ``clip_min``, ``clip_max``, ``sync_grad``; ``synchronize_parameters()`` before evaluating or saving; in
      buckets of ``bucket_mb`` MiB (as Average's; each a range of the one global mask, no per-bucket state, so a
      checkpoint of another ``bucket_mb`` loads) whose momentum and masked average start during backward with
      ``overlap=True`` (the default; ``overlap=False``: after it, bit-identical results; with overlap a ``.grad``
      edited after ``synchronize()`` is reduced again in ``step()``).
    - ``op=hc.Birder`` (wraps ``hc.Birder``): paper 004's 1-bit algorithm (see ``hvd_compress.torch.birder``);
      options ``hierarchical`` (Section 4 over the nodes), ``seed``; in buckets of ``bucket_mb`` MiB (as Average's;
      each bucket keeps its own m, b and error feedback and draws from its own Philox key) whose core call starts
      during backward with ``overlap=True`` (the default; ``overlap=False``: after it, bit-identical results; with
      overlap a ``.grad`` edited after ``synchronize()`` is reduced again in ``step()``).

    Sparse gradients (``nn.Embedding(sparse=True)``), with ``op=Average``/``Sum``: reduced as Horovod does (an
    allgather of indices and values, coalesced; Average divides by the world size), so ``torch.optim.SparseAdam``
    works; ``sparse_as_dense=True`` densifies them instead. ``process_set`` (op=Average/Sum): the gradients are
    reduced over its members (Average divides by its size); a rank outside it steps on its own gradients, as
    Horovod's.
    Every op takes Horovod's other arguments at Horovod's defaults, so a Horovod script keeps its call
    (``compression=hvd.Compression.none``, ``gradient_predivide_factor=1.0``, ``num_groups=0``, ``groups=None``,
    ``sparse_as_dense=False``); a value an op does not interpret raises ``ValueError`` naming what it takes.
    - ``compression=`` (Average/Sum): ``hc.Compression.none``, ``fp16``, ``bf16``, ``topk(ratio)``,
      ``randomk(ratio, seed)`` (or Horovod's ``hvd.Compression.none``/``fp16``); top-k/random-k keep their
      error feedback per fused buffer in ``state_dict()``. ``topk(ratio, momentum=0.9)`` is Deep Gradient
      Compression's momentum correction: the momentum lives in the compression (its velocity is in
      ``state_dict()`` too), so wrap ``torch.optim.SGD(..., momentum=0)``; an optimizer with its own momentum
      (SGD/RMSprop ``momentum``, Adam's beta1) raises ``ValueError``, as momentum would be applied twice (at
      construction, and at ``step()``/``synchronize()`` for one given later, before anything is sent);
      ``momentum_masking=False`` is what matched dense momentum SGD in tests/test_compression_fidelity.py.

    The result is an instance of a subclass of ``optimizer``'s class, built on the same
    ``param_groups`` and carrying over its state, so LR schedulers and ``state_dict()`` work.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if op is Birder:  # hc.Birder is the optimizer class and, as op=, the algorithm
        op = ReduceOp.Birder
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
    if process_set is not None:
        ensure_init()
    process_set = process_sets.resolve(process_set)
    if process_set is not None:
        if op not in (ReduceOp.Average, ReduceOp.Sum):
            raise ProcessSetError(
                f"DistributedOptimizer(op={op.name}) reduces over the global set only; process_set={process_set!r} "
                "works with op=hc.Average and op=hc.Sum"
            )
        algorithm_options["process_set"] = process_set
    compression = resolve_compression(algorithm_options.pop("compression", None))
    if compression.kind != "none":
        if op not in (ReduceOp.Average, ReduceOp.Sum):
            raise ValueError(
                f"compression={compression!r} applies to op=Average or Sum; op={op.name} compresses its own way"
            )
        algorithm_options["compression"] = compression
    wrap = _WRAPPERS.get(op)
    if wrap is None:
        raise NotImplementedError(f"DistributedOptimizer(op={op.name}) is not available yet")
    # Horovod's sparse_as_dense: interpreted by Average/Sum, refused by the other ops unless at its default.
    algorithm_options = {**algorithm_options, "sparse_as_dense": sparse_as_dense}
    return wrap(optimizer, named_parameters, op, backward_passes_per_step, algorithm_options)


def _dense(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
           options: dict[str, Any]) -> torch.optim.Optimizer:
    options = dict(options)
    pop_horovod_defaults(options, f"DistributedOptimizer(op={op.name})", _DENSE_HOROVOD, _DENSE_OPTIONS)
    predivide = options.pop("gradient_predivide_factor", 1.0)
    sparse_as_dense = bool(options.pop("sparse_as_dense", False))
    compression = options.pop("compression", Compression.none)
    process_set = options.pop("process_set", None)
    overlap = options.pop("overlap", None)
    bucket_mb = options.pop("bucket_mb", DEFAULT_BUCKET_MB)
    if options:
        raise TypeError(f"op={op.name} got unknown options {sorted(options)}; it takes {', '.join(_DENSE_OPTIONS)}, "
                        f"{NOTE}")
    check_predivide(predivide, op)
    _check_overlap_options(False if overlap is None else overlap, bucket_mb)
    if overlap and compression.stateful:
        raise ValueError(
            f"overlap=True does not apply to compression={compression!r}: its selection and error feedback are "
            "per whole buffer, reduced in step() (leave overlap unset)"
        )
    overlap = not compression.stateful if overlap is None else overlap
    _check_no_second_momentum(optimizer, compression)
    wrapped = rewrap(optimizer, _DistributedMixin)
    wrapped._hvdc_setup(named_parameters, op, passes, predivide, sparse_as_dense, compression, overlap, bucket_mb,
                        process_set)
    return wrapped


def _check_no_second_momentum(optimizer: torch.optim.Optimizer, compression: Compressor, when: str = "") -> None:
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


def _check_overlap_options(overlap: Any, bucket_mb: Any) -> None:
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap must be True or False, got {overlap!r}")
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be a positive number of MiB, got {bucket_mb!r}")


def _bucket_options(options: dict[str, Any]) -> tuple[dict[str, Any], bool, float]:
    """(the other options, ``overlap`` (default True), ``bucket_mb``) of an algorithm whose segments are buckets."""
    options = dict(options)
    overlap, bucket_mb = options.pop("overlap", True), options.pop("bucket_mb", DEFAULT_BUCKET_MB)
    _check_overlap_options(overlap, bucket_mb)
    return options, overlap, bucket_mb


def _horovod_defaults(options: dict[str, Any], op: ReduceOp, takes: list[str]) -> dict[str, Any]:
    """``options`` without Horovod's arguments at their defaults; ValueError for one set otherwise, naming
    ``takes`` (what this op takes)."""
    options = dict(options)
    pop_horovod_defaults(options, f"DistributedOptimizer(op={op.name})", takes=takes)
    return options


#: What op=Average/Sum take beside Horovod's arguments at their defaults (and which of those they interpret).
_DENSE_OPTIONS = ["compression", "gradient_predivide_factor", "sparse_as_dense", "overlap", "bucket_mb"]
_DENSE_HOROVOD = ("gradient_predivide_factor", "sparse_as_dense")
_ADASUM_FACE = ("grad_scaler",)  # the torch face's own option of op=Adasum, beside AdasumOptions


def _adasum(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
            options: dict[str, Any]) -> torch.optim.Optimizer:
    options = _horovod_defaults(options, op, option_names(AdasumOptions, _ADASUM_FACE))
    grad_scaler = options.pop("grad_scaler", None)
    parsed = build_options(AdasumOptions, op.name, options, also=_ADASUM_FACE)
    wrapped = rewrap(optimizer, AdasumMixin)
    wrapped._hvdc_setup(named_parameters, passes, grad_scaler, **dataclasses.asdict(parsed))
    return wrapped


def _onebit(check: Any) -> Any:
    """The wrapper for a 1-bit algorithm whose wrapped torch optimizer ``check`` accepts."""

    def wrap(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
             options: dict[str, Any]) -> torch.optim.Optimizer:
        check(optimizer)
        algorithm = algorithms.lookup(op)
        options = _horovod_defaults(options, op, option_names(algorithm.options_cls))
        options, overlap, bucket_mb = _bucket_options(options)
        parsed = parse_options(algorithm.options_cls, algorithm.name, options)
        wrapped = rewrap(optimizer, OneBitMixin)
        wrapped._hvdc_setup(named_parameters, passes, algorithm(parsed, BACKEND, [], None), overlap, bucket_mb)
        return wrapped

    return wrap


def _slamb(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
           options: dict[str, Any]) -> torch.optim.Optimizer:
    check_slamb_lamb(optimizer)
    options = _horovod_defaults(options, op, option_names(slamb.SlambOptions))
    options, overlap, bucket_mb = _bucket_options(options)
    parsed = slamb.parse_options(options)
    wrapped = rewrap(optimizer, SlambMixin)
    wrapped._hvdc_setup(named_parameters, passes, parsed, overlap, bucket_mb)
    return wrapped


def _birder(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
            options: dict[str, Any]) -> torch.optim.Optimizer:
    check_birder(optimizer)
    algorithm = algorithms.lookup(op)
    options = _horovod_defaults(options, op, option_names(algorithm.options_cls))
    options, overlap, bucket_mb = _bucket_options(options)
    wrapped = rewrap(optimizer, BirderMixin)
    wrapped._hvdc_setup(named_parameters, passes, algorithm(parse_birder_options(options), BACKEND, [], None),
                        overlap, bucket_mb)
    return wrapped


#: The face of each op: reductions (Average, Sum, Adasum) and the algorithms of ``hvd_compress.algorithms``.
_WRAPPERS = {
    ReduceOp.Average: _dense,
    ReduceOp.Sum: _dense,
    ReduceOp.Adasum: _adasum,
    ReduceOp.OneBitAdam: _onebit(check_adam),
    ReduceOp.OneBitLamb: _onebit(check_lamb),
    ReduceOp.SLAMB: _slamb,
    ReduceOp.Birder: _birder,
}
