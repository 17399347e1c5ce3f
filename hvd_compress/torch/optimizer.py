"""``hc.DistributedOptimizer``: Horovod's drop-in optimizer wrapper, on the hvd_compress core: the engine of each op
(``_WRAPPERS``), composed into one subclass of the wrapped optimizer's class (``wrapping.compose``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import algorithms
from hvd_compress.algorithms.adasum_delta import AdasumOptions
from hvd_compress.algorithms.options import option_names, parse_options
from hvd_compress.ops import process_sets
from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB
from hvd_compress.ops.compression import resolve as resolve_compression
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.errors import NotInitializedError, ProcessSetError
from hvd_compress.ops.horovod_args import pop_horovod_defaults
from hvd_compress.torch.adasum_optimizer import AdasumEngine
from hvd_compress.torch.birder import BirderEngine
from hvd_compress.torch.bucketed import BucketedEngine
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.dense import DenseEngine, check_overlap_options
from hvd_compress.torch.diloco import DiLoCoEngine
from hvd_compress.torch.inner import check_inner
from hvd_compress.torch.onebit_optimizer import OneBitEngine
from hvd_compress.torch.powersgd import PowerSGDEngine
from hvd_compress.torch.slamb_optimizer import SlambEngine
from hvd_compress.torch.wrapping import compose
from hvd_compress.torch.zero_one_adam import ZeroOneAdamEngine


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
    - any other algorithm of ``hvd_compress.algorithms.REGISTRY`` (``hc.<name>``): its page in docs/algorithms/
      says which optimizer it wraps and its options; ``bucket_mb`` and ``overlap`` as above.

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

    ``op``: an ``hc`` constant or its name (``"OneBitAdam"``).
    The result is an instance of a subclass of ``optimizer``'s class, built on the same ``param_groups`` (the same
    dicts, as Horovod's: an LR scheduler made on ``optimizer`` before wrapping acts too) and carrying over its state,
    so LR schedulers and ``state_dict()`` work.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    _start_runtime()
    op = algorithms.resolve_op(op)
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
    wrap = _WRAPPERS.get(op) or _algorithm
    # Horovod's sparse_as_dense: interpreted by Average/Sum, refused by the other ops unless at its default.
    algorithm_options = {**algorithm_options, "sparse_as_dense": sparse_as_dense}
    return wrap(optimizer, named_parameters, op, backward_passes_per_step, algorithm_options)


def _start_runtime() -> None:
    """Start hvd_compress's runtime here, where every rank is: its set-up is a collective, and a call made later on
    one rank alone (rank 0's ``load_state_dict`` in Horovod's resume, while the others wait in Horovod's broadcast)
    must not be the one to start it, or both sides wait forever. Nothing where no job was started (one process
    without ``init()``): the first collective says how to start one."""
    try:
        ensure_init()
    except NotInitializedError:
        pass


def _bucket_options(options: dict[str, Any]) -> tuple[dict[str, Any], bool, float]:
    """(the other options, ``overlap`` (default True), ``bucket_mb``) of an algorithm whose buckets are buckets."""
    options = dict(options)
    overlap, bucket_mb = options.pop("overlap", True), options.pop("bucket_mb", DEFAULT_BUCKET_MB)
    check_overlap_options(overlap, bucket_mb)
    return options, overlap, bucket_mb


def _horovod_defaults(options: dict[str, Any], op: ReduceOp, takes: list[str]) -> dict[str, Any]:
    """``options`` without Horovod's arguments at their defaults; ValueError for one set otherwise, naming
    ``takes`` (what this op takes)."""
    options = dict(options)
    pop_horovod_defaults(options, f"DistributedOptimizer(op={op.name})", takes=takes)
    return options


_ADASUM_FACE = ("grad_scaler",)  # the torch face's own option of op=Adasum, beside AdasumOptions


def _adasum(optimizer: torch.optim.Optimizer, named_parameters: Any, op: ReduceOp, passes: int,
            options: dict[str, Any]) -> torch.optim.Optimizer:
    options = _horovod_defaults(options, op, option_names(AdasumOptions, _ADASUM_FACE))
    grad_scaler = options.pop("grad_scaler", None)
    parsed = parse_options(AdasumOptions, op.name, options, also=_ADASUM_FACE)
    return compose(optimizer, AdasumEngine, named_parameters, passes, grad_scaler, parsed)


#: The torch engine of each buffer set an algorithm declares (``algorithms.contract.BUFFERS``).
_ENGINES: dict[str, type[BucketedEngine] | type[PowerSGDEngine]] = {
    "onebit": OneBitEngine, "slamb": SlambEngine, "flat": BirderEngine, "zeroone": ZeroOneAdamEngine,
    "lowrank": PowerSGDEngine}


def _algorithm(optimizer: torch.optim.Optimizer, named_parameters: Any, op: AlgorithmOp, passes: int,
               options: dict[str, Any]) -> torch.optim.Optimizer:
    """The wrapper of an algorithm of ``hvd_compress.algorithms``, from its declaration: the engine of its buffers
    over a wrapped torch optimizer of the kind it wraps (``inner.check``)."""
    algorithm = algorithms.lookup(op)
    check_inner(optimizer, algorithm)
    if algorithm.buffers == "local":  # no gradient buckets: bucket_mb and overlap are unknown options here
        options = _horovod_defaults(options, op, option_names(algorithm.options_cls, _DILOCO_FACE))
        outer, buffers = options.pop("outer_optimizer", None), options.pop("buffers", None)
        builtin = sorted(k for k in ("outer_lr", "outer_momentum", "nesterov") if k in options)
        if outer is not None and builtin:
            raise ValueError(f"op=DiLoCo: {builtin} set the built-in outer step; with outer_optimizer, set them in "
                             "that optimizer")
        parsed = algorithms.parse(op, options, also=_DILOCO_FACE)
        return compose(optimizer, DiLoCoEngine, named_parameters, passes, algorithm, parsed, outer, buffers)
    options = _horovod_defaults(options, op, option_names(algorithm.options_cls))
    options, overlap, bucket_mb = _bucket_options(options)
    parsed = algorithms.parse(op, options)
    return compose(optimizer, _ENGINES[algorithm.buffers], named_parameters, passes, algorithm, parsed, overlap,
                   bucket_mb)


#: DiLoCo's options that the torch face takes beside the algorithm's: a torch outer optimizer's factory, the
#: model's buffers (averaged at each merge).
_DILOCO_FACE = ("outer_optimizer", "buffers")

#: The engines of the reductions; every other op is an algorithm of ``hvd_compress.algorithms`` (``_algorithm``).
_WRAPPERS = {
    ReduceOp.Average: DenseEngine.wrap,
    ReduceOp.Sum: DenseEngine.wrap,
    ReduceOp.Adasum: _adasum,
}
