"""Collectives on TensorFlow tensors, in eager mode and inside ``tf.function``.

Each call is one ``tf.numpy_function(stateful=True)``: TF keeps stateful ops in program order, so every rank
issues its collectives in the order of its program (with ``stateful=False`` TF may reorder them, and ranks
that reduce different tensors at the same time deadlock). TF's input arrays alias its tensors (a variable's
buffer too), so they are copied into 64-byte aligned arrays of our own, reduced there, and handed back
without another copy.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from hvd_compress import ops
from hvd_compress.ops import call_names, process_sets
from hvd_compress.ops import compression as compression_ops
from hvd_compress.ops import masks as mask_ops
from hvd_compress.ops import onebit as onebit_ops
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.backend import BACKEND, aligned_copy, aligned_empty
from hvd_compress.tensorflow.context import ensure_init

#: The dtypes the core reduces (bfloat16 has no NumPy DLPack export; cast it to float32 first). Integer tensors:
#: Sum, Min, Max, Product, and Average as Horovod's (the sum times 1/size, truncated toward zero).
REDUCE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def numpy_call(fn: Callable[..., Any], inputs: Sequence[Any], touts: Sequence[tf.DType], name: str) -> list[tf.Tensor]:
    """``fn`` on NumPy copies of ``inputs`` at run time, as one stateful op (program order kept)."""
    outs = tf.numpy_function(fn, list(inputs), list(touts), stateful=True, name=name.replace(".", "_") or None)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def dense(value: Any) -> tf.Tensor:
    """A dense tensor for ``value``; ``IndexedSlices`` (embedding gradients) are densified, as Horovod's
    ``sparse_as_dense=True``: hvd_compress reduces dense buffers only."""
    if isinstance(value, tf.IndexedSlices):
        return tf.convert_to_tensor(tf.math.unsorted_segment_sum(value.values, value.indices,
                                                                   value.dense_shape[0]))
    return tf.convert_to_tensor(value)


def check_reduce_dtype(t: tf.Tensor, what: str) -> None:
    if t.dtype not in REDUCE_DTYPES:
        raise ops.UsageError(
            f"{what}: dtype {t.dtype.name} is not supported; use one of {[d.name for d in REDUCE_DTYPES]} "
            "(cast bfloat16 to float32 first)"
        )


def check_not_xla(what: str) -> None:
    """XLA cannot run a ``tf.numpy_function``: say so at trace time (every rank traces alike), not as an XLA error."""
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"{what}: hvd_compress cannot run under XLA; use jit_compile=False (tf.function(jit_compile=False), "
            "model.compile(..., jit_compile=False))"
        )


def _resolve_op(op: Any) -> ReduceOp:
    if isinstance(op, AlgorithmOp):
        raise ValueError(f"op {op.name} is an optimizer algorithm: use hvd_compress.keras.DistributedOptimizer")
    try:
        return ReduceOp(Average if op is None else op)
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}; use one of {[o.name for o in ReduceOp]}") from None


def check_group_compression(compression: Any, op: ReduceOp, name: str) -> Any:
    """The stateless compressor (none, fp16, bf16) of a fused reduction, or None for none; raises ValueError on
    bad ones (on every rank alike: decided before any communication)."""
    compressor = compression_ops.resolve(compression)
    if compressor.kind == "none":
        return None
    if compressor.stateful:
        raise ValueError(f"{name}: compression={compressor!r} keeps error feedback per buffer; fused reductions take "
                         "hc.Compression.none, fp16 or bf16 (hc.allreduce with a state takes top-k/random-k)")
    if op not in (ReduceOp.Average, ReduceOp.Sum):
        raise ValueError(f"{name}: compression={compressor!r} needs op=Average or Sum, got {op.name}")
    return compressor


def _reduce_gradient(op: ReduceOp, name: str, compression: Any = None,
                     process_set: Any = None) -> Callable[..., list[tf.Tensor]]:
    """The gradient of a reduction: the same reduction of the upstream gradients (Sum, Average, Adasum), as
    Horovod's; Min, Max and Product have none (Horovod raises too)."""
    def grad(*upstream: tf.Tensor) -> list[tf.Tensor]:
        if op not in (ReduceOp.Sum, ReduceOp.Average, ReduceOp.Adasum):
            raise NotImplementedError(f"{name}: the gradient of op={op.name} is not implemented (as in Horovod)")
        return grouped_allreduce(upstream, op=op, name=f"{name}.grad", compression=compression,
                                 process_set=process_set)

    return grad


Average, Sum = ReduceOp.Average, ReduceOp.Sum


def reduce_group(arrays: list[np.ndarray], op: ReduceOp, name: str, compression: Any = None) -> list[np.ndarray]:
    """Reduce ``arrays`` (our own copies) in place: Sum/Average fused into one buffer per dtype (one core call
    each, in order of first appearance, so every rank makes the same calls; ``compression``, a stateless
    compressor, applies to each), Adasum as one grouped exchange."""
    if op == ReduceOp.Adasum:
        if len({a.dtype for a in arrays}) > 1:
            raise ops.UsageError(f"{name}: Adasum groups need one dtype, got {sorted({str(a.dtype) for a in arrays})}")
        ops.grouped_allreduce_(arrays, op=op, name=name)  # with their shapes, into the signature
        return arrays
    if len(arrays) == 1:  # with its shape: the core's signature then tells equal sizes of other shapes apart
        ops.allreduce_(arrays[0], op=op, name=name, compression=compression)
        return arrays
    # A fused buffer loses the shapes: they go into the call's name, which every rank's signature must match.
    shapes = ";".join("x".join(map(str, a.shape)) for a in arrays)
    name = call_names.suffixed(name, f"#{zlib.crc32(shapes.encode()):08x}")
    by_dtype: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    for k, (dtype, members) in enumerate(by_dtype.items()):
        fused = aligned_empty(sum(arrays[i].size for i in members), dtype)
        offsets = np.cumsum([0] + [arrays[i].size for i in members])
        for i, lo, hi in zip(members, offsets[:-1], offsets[1:], strict=True):
            fused[lo:hi] = arrays[i].reshape(-1)
        ops.allreduce_(fused, op=op, name=call_names.indexed(name, k) if len(by_dtype) > 1 else name,
                       compression=compression)
        for i, lo, hi in zip(members, offsets[:-1], offsets[1:], strict=True):
            arrays[i].reshape(-1)[...] = fused[lo:hi]
    return arrays


def reduced_group(inputs: Sequence[tf.Tensor], op: ReduceOp, name: str, compressor: Any = None,
                  process_set: Any = None, meter: CommMeter | None = None) -> list[tf.Tensor]:
    """``reduce_group`` of ``inputs`` (dense tensors) as one stateful op, no gradient: new tensors of their shapes.
    ``meter``: a wrapper's, which counts the bytes as its own (``comm_stats``)."""

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        with process_sets.scope(process_set):  # here: TF may run this on a thread of its own
            copies = [aligned_copy(np.asarray(a)) for a in arrays]
            if meter is None:
                return reduce_group(copies, op, name, compressor)
            return meter.run(reduce_group, copies, op, name, compressor)

    outs = numpy_call(run, inputs, [x.dtype for x in inputs], name)
    for o, x in zip(outs, inputs, strict=True):
        o.set_shape(x.shape)
    return outs


def grouped_allreduce(tensors: Sequence[Any], op: Any = None, name: str | None = None,
                      compression: Any = None, process_set: Any = None) -> list[tf.Tensor]:
    """New tensors: the reduction of each of ``tensors`` over all ranks, in one stateful call.

    Sum/Average: one fused buffer per dtype, with ``compression`` ``hc.Compression.none``/``fp16``/``bf16``
    (top-k/random-k keep error feedback per buffer: ``allreduce`` with a ``state``). Adasum: one exchange with
    per-tensor coefficients (one dtype). ``IndexedSlices`` are densified. Differentiable: the gradient is the
    same reduction of the upstream gradients. ``process_set``: over its members only (Horovod's)."""
    ensure_init()
    ps = process_sets.require_member(process_set)
    check_not_xla(name or "grouped_allreduce")
    op = _resolve_op(op)
    name = name or "grouped_allreduce"
    compressor = check_group_compression(compression, op, name)
    inputs = [dense(t) for t in tensors]
    if not inputs:
        return []
    for t in inputs:
        check_reduce_dtype(t, name)

    @tf.custom_gradient
    def reduce(*xs: tf.Tensor) -> Any:
        return reduced_group(xs, op, name, compressor, ps), _reduce_gradient(op, name, compressor, ps)

    return list(reduce(*inputs))


def allreduce(tensor: Any, op: Any = None, name: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, compression: Any = None, state: Any = None,
              process_set: Any = None) -> tf.Tensor:
    """A new tensor: ``tensor`` reduced over all ranks (Average by default; Sum, Min, Max, Product; Adasum: the
    whole tensor is one Adasum vector). Horovod's scale factors multiply the input before and the result after.
    ``compression`` (``hc.Compression.fp16``, ``topk(ratio)``, ``randomk(ratio, seed)``; Average/Sum, floating
    tensors) compresses what travels; top-k/random-k keep error feedback in ``state`` (``hc.CompressionState``,
    one per tensor, kept across calls) and have no gradient (their error feedback is a state, not a function).
    ``process_set``: over its members only (Horovod's)."""
    t = dense(tensor)
    if prescale_factor != 1.0:
        t = t * tf.cast(prescale_factor, t.dtype)
    if compression is not None and compression_ops.resolve(compression).kind != "none":
        out = _compressed_allreduce(t, op, name or "allreduce", compression_ops.resolve(compression), state,
                                    process_set)
    else:
        out = grouped_allreduce([t], op=op, name=name or "allreduce", process_set=process_set)[0]
    if postscale_factor != 1.0:
        out = out * tf.cast(postscale_factor, out.dtype)
    return out


def _compressed_allreduce(t: tf.Tensor, op: Any, name: str, compressor: Any, state: Any,
                          process_set: Any = None) -> tf.Tensor:
    ensure_init()
    ps = process_sets.require_member(process_set)
    check_not_xla(name)
    op = _resolve_op(op)
    check_reduce_dtype(t, name)
    if compressor.stateful and not isinstance(state, CompressionState):
        raise TypeError(f"{compressor!r} keeps error feedback: pass state=hc.CompressionState(numel, compression), "
                        f"got {type(state).__name__}")

    def run(x: np.ndarray) -> np.ndarray:
        out = aligned_copy(np.asarray(x))
        with process_sets.scope(ps):
            ops.allreduce_(out, op=op, name=name, compression=compressor, state=state)
        return out

    def forward(x: tf.Tensor) -> tf.Tensor:
        out = numpy_call(run, [x], [x.dtype], name)[0]
        out.set_shape(x.shape)
        return out

    if compressor.stateful:
        return forward(t)

    @tf.custom_gradient
    def reduce(x: tf.Tensor) -> Any:
        def grad(upstream: tf.Tensor) -> tf.Tensor:
            return _compressed_allreduce(upstream, op, f"{name}.grad", compressor, None, ps)

        return forward(x), grad

    return reduce(t)


class CompressionState(compression_ops.CompressionState):
    """Error feedback (float32, NumPy, owned by this object) and step of one tensor reduced with ``compression``
    (``hc.Compression.topk(...)``/``randomk(...)``): keep one per tensor across calls, save its ``state_dict()``.
    ``sizes``: the tensors a fused buffer holds (default one)."""

    def __init__(self, numel: int, compression: Any, sizes: list[int] | None = None) -> None:
        super().__init__(numel, compression_ops.resolve(compression), BACKEND, None, sizes)


def allgather(tensor: Any, name: str | None = None, process_set: Any = None) -> tf.Tensor:
    """A new tensor: every rank's ``tensor`` concatenated on the first dim, in rank order (Horovod's allgather).
    The first dim may differ per rank; the other dims and the dtype must agree (``hc.MismatchError`` on every
    rank otherwise). Differentiable as Horovod's: the gradient is the average over ranks of the upstream
    gradient, cut to this rank's rows. ``process_set``: its members' tensors, in the order of their ranks."""
    ensure_init()
    ps = process_sets.require_member(process_set)
    name = name or "allgather"
    check_not_xla(name)
    t = dense(tensor)
    if t.shape.rank == 0:
        raise ValueError(f"{name}: allgather needs a tensor with at least one dimension")

    def run(x: np.ndarray) -> list[np.ndarray]:
        with process_sets.scope(ps):
            data, rows = ops.allgather(aligned_copy(np.asarray(x)), name=name)
        out = aligned_empty(data.size, np.uint8)
        np.copyto(out, data)  # our own 64-byte aligned array: TF adopts it without a copy
        return [out.view(x.dtype).reshape(sum(rows), *x.shape[1:]), np.asarray(rows, np.int64)]

    @tf.custom_gradient
    def gather(x: tf.Tensor) -> Any:
        out, rows = numpy_call(run, [x], [x.dtype, tf.int64], name)
        out.set_shape([None, *x.shape[1:]])

        def grad(upstream: tf.Tensor) -> tf.Tensor:
            reduced = allreduce(upstream, op=ReduceOp.Average, name=f"{name}.grad", process_set=ps)
            with process_sets.scope(ps):
                me = ops.rank()  # within the set
            start = tf.reduce_sum(rows[:me])
            return tf.reshape(reduced[start: start + rows[me]], tf.shape(x))

        return out, grad

    return gather(t)


def broadcast_values(tensors: Sequence[Any], root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> list[tf.Tensor]:
    """New tensors holding root_rank's values of ``tensors`` (any dtype, copied as bytes), in one stateful call.
    ``process_set``: its members only; ``root_rank`` is a world rank in it (as in Horovod)."""
    ensure_init()
    ps = process_sets.require_member(process_set)
    name = name or "broadcast"
    check_not_xla(name)
    inputs = [tf.convert_to_tensor(t) for t in tensors]
    if not inputs:
        return []

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = [aligned_copy(np.asarray(a)) for a in arrays]
        with process_sets.scope(ps):
            for i, o in enumerate(outs):
                if o.size:  # as bytes: every dtype (int64 step counters, bool, bfloat16) travels alike
                    process_sets.broadcast_in_set(o.reshape(-1).view(np.uint8), int(root_rank),
                                                  call_names.indexed(name, i), ps)
        return outs

    outs = numpy_call(run, inputs, [t.dtype for t in inputs], name)
    for o, t in zip(outs, inputs, strict=True):
        o.set_shape(t.shape)
    return outs


def broadcast(tensor: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> tf.Tensor:
    """A new tensor holding root_rank's value of ``tensor`` (``process_set``: as ``broadcast_values``)."""
    return broadcast_values([tensor], root_rank, name, process_set)[0]


def join() -> None:
    """Horovod's ``hvd.join``: returns once every rank called it. A rank in it while another still steps (uneven
    data) makes every rank raise ``MismatchError`` naming it (``ops.join``)."""
    ensure_init()
    ops.join()


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0, name: str | None = None,
                        process_set: Any = None) -> Any:
    """Assign root_rank's values to ``variables`` (``tf.Variable`` or Keras variables) on every rank.

    Eager: done when it returns. In a ``tf.function``: returns the grouped assign op."""
    variables = list(variables)
    values = broadcast_values([tf.convert_to_tensor(v) for v in variables], root_rank, name or "broadcast_variables",
                              process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values, strict=True)]
    return tf.group(*[a for a in assigns if a is not None]) if not tf.executing_eagerly() else None


class OneBitState(onebit_ops.OneBitState):
    """Error feedback of one buffer of ``numel`` elements for ``compressed_allreduce`` (NumPy buffers owned by
    this object; ``state_dict()``/``load_state_dict()`` as the torch face's). ``world_size`` defaults to the
    job's size."""

    def __init__(self, numel: int, dtype: Any = tf.float32, world_size: int | None = None) -> None:
        if world_size is None:
            ensure_init()
            world_size = ops.size()
        super().__init__(numel, tf.as_dtype(dtype).name, int(world_size), BACKEND, None)


def compressed_allreduce(tensor: Any, state: OneBitState, name: str | None = None) -> tf.Tensor:
    """A new tensor: the error-compensated 1-bit average of ``tensor`` (float32/float16) over all ranks.

    Each run (eager call, or each execution of the enclosing ``tf.function``) updates ``state``."""
    ensure_init()
    if not isinstance(state, OneBitState):
        raise TypeError(f"compressed_allreduce expects an hc.OneBitState, got {type(state).__name__}")
    t = dense(tensor)
    name = name or "compressed_allreduce"
    check_not_xla(name)

    def run(x: np.ndarray) -> np.ndarray:
        out = aligned_copy(np.asarray(x)).reshape(-1)
        onebit_ops.compressed_allreduce_(out, state.worker_error, state.server_error, name=name)
        return out.reshape(x.shape)

    out = numpy_call(run, [t], [t.dtype], name)[0]
    out.set_shape(t.shape)
    return out


def random_mask(numel: int, ratio: float, seed: int, step: Any, kind: str = "cyclic") -> tf.Tensor:
    """The bool mask of (numel, ratio, seed, step, kind) (``hvd_compress.ops.masks``): the same on every rank,
    nothing sent. ``step`` may be a tensor (e.g. an optimizer's ``iterations``), so that inside ``tf.function``
    the mask follows the step instead of freezing at trace time."""
    mask_ops.check_mask_args(ratio, seed, 0)
    mask_ops.mask_kind(kind)
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"random_mask: numel must be an int >= 0, got {numel!r}")

    def run(s: np.ndarray) -> np.ndarray:
        out = np.zeros(numel, dtype=bool)
        return mask_ops.random_mask_(out, ratio, seed, int(s), kind)

    out = numpy_call(run, [tf.convert_to_tensor(step, dtype=tf.int64)], [tf.bool], "random_mask")[0]
    out.set_shape([numel])
    return out


def masked_allreduce(tensor: Any, ratio: float, seed: int, step: Any, kind: str = "cyclic",
                     name: str | None = None) -> tf.Tensor:
    """A new tensor: the elements of ``tensor`` (float16/32/64) that ``random_mask(numel, ratio, seed, step,
    kind)`` selects, averaged over all ranks; the others keep this rank's values (SLAMB's reduction: one dense
    buffer of the selected values, no index sent). ``step`` may be a tensor, as for ``random_mask``; ranks whose
    mask arguments differ raise ``MismatchError`` on every rank."""
    ensure_init()
    mask_ops.check_mask_args(ratio, seed, 0)
    mask_ops.mask_kind(kind)
    t = dense(tensor)
    if t.dtype not in (tf.float16, tf.float32, tf.float64):
        raise TypeError(f"masked_allreduce: float16/32/64 tensors only, got {t.dtype.name}")
    name = name or "masked_allreduce"
    check_not_xla(name)

    def run(x: np.ndarray, s: np.ndarray) -> np.ndarray:
        out = aligned_copy(np.asarray(x)).reshape(-1)
        mask_ops.masked_allreduce_(out, ratio, seed, int(s), kind, name=name)
        return out.reshape(x.shape)

    out = numpy_call(run, [t, tf.convert_to_tensor(step, dtype=tf.int64)], [t.dtype], name)[0]
    out.set_shape(t.shape)
    return out
