"""Gradient buckets of ``op=Average``/``Sum`` reduced while backward still runs (Horovod's overlap in TF, DDP's
buckets), for ``hck.DistributedOptimizer`` and ``hc.DistributedGradientTape``.

Inside a ``tf.function`` TF runs an op as soon as its inputs exist, whatever the order of the Python program.
Each bucket (``ops.buckets.plan_buckets``: reverse variable order, the order backward produces gradients; 1 MB
first, then ``bucket_mb``) gets its own stateful start op whose inputs are that bucket's gradients only: it copies
them and hands their reduction to the process's one background thread (``runtime.submit``), so the exchange of the
last layers' gradients runs while TF still computes the first layers'. One finish op, fed by every start op, waits
for all of them and returns the reduced gradients. Stateful ops keep program order, so every rank starts its
buckets in bucket order; the background thread issues them in that order.

``overlap=False`` gates every start op on every gradient: the same calls on the same buckets after backward,
so the results are bit-identical. In eager mode the ops run where the program calls them (after backward).
The reduced gradients are not differentiable.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress.algorithms import agreement
from hvd_compress.ops import runtime
from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB, FIRST_BUCKET_MB, plan_buckets
from hvd_compress.ops.collectives import check_predivide, reject_allreduce
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import MismatchError
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.backend import aligned_copy
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.functions import (
    check_group_compression,
    check_not_xla,
    check_reduce_dtype,
    dense,
    numpy_call,
    reduce_group,
)

MIB = 1 << 20


@dataclass(frozen=True)
class HyperValues:
    """An optimizer's hyper-parameters for the tag of a reduction's call names (``algorithms.agreement.tagged``):
    their ``names`` and a float64 tensor of their ``values``, read when the step runs (a schedule's or a
    callback's learning rate counts), passed to the call as one more input."""

    names: tuple[str, ...]
    values: tf.Tensor
    #: What the call names' details hold beside them: the op (``agreement.tagged``'s ``call``), known when traced.
    call: tuple[tuple[str, str], ...] = ()

    def group(self, values: np.ndarray) -> dict[str, float]:
        """The param group ``agreement`` tags: each name with its value in this run."""
        return dict(zip(self.names, np.asarray(values, np.float64).reshape(-1).tolist(), strict=True))


@dataclass(frozen=True)
class CallTag:
    """What one run of a reduction tags its call names with (``agreement.tagged``), or nothing (``group`` None)."""

    group: dict[str, float] | None = None
    call: tuple[tuple[str, str], ...] = ()

    def name(self, name: str) -> str:
        return name if self.group is None else agreement.tagged(name, [self.group], call=dict(self.call))

    def explained(self, e: MismatchError, who: str) -> MismatchError:
        """``e`` with this rank's hyper-parameters where the tags differed (``agreement.mismatch_explained``)."""
        return agreement.mismatch_explained(e, who, None if self.group is None else [self.group])


def call_tag(hyper: HyperValues | None, arrays: Sequence[np.ndarray]) -> tuple[CallTag, Sequence[np.ndarray]]:
    """The tag of a NumPy call whose last input is ``hyper.values`` (where ``hyper`` is given) and its other
    inputs."""
    if hyper is None:
        return CallTag(), arrays
    return CallTag(hyper.group(arrays[-1]), hyper.call), arrays[:-1]


def check_bucket_mb(bucket_mb: Any) -> float:
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be a number > 0, got {bucket_mb!r}")
    return float(bucket_mb)


def check_overlap(overlap: Any) -> bool:
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap must be True or False, got {overlap!r}")
    return overlap


@dataclass
class BucketStats:
    """What the start ops did, for tests and benchmarks: buckets handed to the background thread so far."""

    launched: int = 0


@contextlib.contextmanager
def none_gradients_left_out(count: int) -> Iterator[None]:
    """Around the reduction of the gradients that are not None (``count`` were, on this rank): a ``MismatchError``
    there gets its likely cause, on every rank. A None gradient is left out, as Keras leaves it, so a variable the
    loss reaches on some ranks only (a branch taken by rank) makes the ranks' buckets differ."""
    try:
        yield
    except MismatchError as e:
        raise MismatchError(
            f"{e}\nNone gradients are left out (this rank left out {count}), so a variable whose gradient is None on "
            "some ranks only (a branch the loss takes on some ranks) makes the ranks reduce different tensors. If "
            "that is the cause, give it a zero gradient on every rank, before apply_gradients: "
            "[tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]; "
            "DistributedGradientTape.gradient takes unconnected_gradients=tf.UnconnectedGradients.ZERO (with Keras 3 "
            "variables, pass their v.value as the sources)") from e


@tf.autograph.experimental.do_not_convert  # plain Python at trace time: nothing to convert
def bucketed_allreduce(tensors: Sequence[Any], op: ReduceOp, name: str, compression: Any = None,
                       bucket_mb: float = DEFAULT_BUCKET_MB, overlap: bool = True,
                       stats: BucketStats | None = None, meter: CommMeter | None = None,
                       predivide: float = 1.0, hyper: HyperValues | None = None) -> list[tf.Tensor]:
    """New tensors: Average or Sum of each of ``tensors`` over all ranks, bucket by bucket (module docstring).

    ``compression``: ``hc.Compression.none``, ``fp16`` or ``bf16``. A NaN is reduced as any value (Horovod's).
    ``meter``: counts the bytes of the reductions (a wrapper's ``comm_stats``). ``predivide`` (Horovod's
    ``gradient_predivide_factor`` f, op=Average, floating tensors): the Sum of x / f, times f / size.
    ``hyper``: an optimizer's hyper-parameters, whose values when the step runs tag each bucket's call name
    (``HyperValues``): ranks where they differ raise MismatchError on every rank before any data moves."""
    ensure_init()
    check_not_xla(name)
    op = ReduceOp(op)
    if op not in (ReduceOp.Average, ReduceOp.Sum):
        raise ValueError(f"{name}: bucketed reductions are Average or Sum, got {op.name}")
    compressor = check_group_compression(compression, op, name)
    bucket_bytes = int(check_bucket_mb(bucket_mb) * MIB)
    check_overlap(overlap)
    inputs = [dense(t) for t in tensors]
    for t in inputs:
        check_reduce_dtype(t, name)
    if not inputs:
        return []
    if check_predivide(predivide, op) != 1.0:
        if not all(t.dtype.is_floating for t in inputs):
            raise ValueError(f"{name}: gradient_predivide_factor needs floating tensors")
        scaled = [t * tf.constant(1.0 / predivide, t.dtype) for t in inputs]
        summed = bucketed_allreduce(scaled, ReduceOp.Sum, name, compression, bucket_mb, overlap, stats, meter,
                                    hyper=hyper)
        post = predivide / runtime.size()
        return [t * tf.constant(post, t.dtype) for t in summed]
    # A size unknown at trace time (a densified IndexedSlices of a dynamic shape) closes a bucket of its own.
    items = [(x.dtype, bucket_bytes if x.shape.num_elements() is None else x.shape.num_elements() * x.dtype.size)
             for x in inputs]
    buckets = plan_buckets(items, bucket_bytes, min(bucket_bytes, int(FIRST_BUCKET_MB * MIB)))
    # token -> a bucket's reduction. Each run of a start op makes a new token, which only the finish op of the same
    # run receives (as data): runs that overlap (a loop of train steps) cannot take each other's results.
    pending: dict[int, tuple[concurrent.futures.Future, CallTag]] = {}
    tokens_made = itertools.count()

    def starter(b: int) -> Any:
        def start(*inputs: np.ndarray) -> np.ndarray:
            tag, arrays = call_tag(hyper, inputs)
            call = tag.name(f"{name}.b{b}")
            try:
                copies = [aligned_copy(np.asarray(a)) for a in arrays]
            except Exception as e:  # this rank's alone: it joins the call as a rejection, the others raise too
                runtime.submit(reject_allreduce, f"{type(e).__name__}: {e}", call).result()
                raise
            token = next(tokens_made)
            if meter is None:
                future = runtime.submit(reduce_group, copies, op, call, compressor)
            else:  # the meter counts the calls of the thread that runs it: the background thread's
                future = runtime.submit(meter.run, reduce_group, copies, op, call, compressor)
            pending[token] = (future, tag)
            if stats is not None:
                stats.launched += 1
            return np.array(token, np.int64)

        return start

    def finish(*tokens: np.ndarray) -> list[np.ndarray]:
        started = [pending.pop(int(t)) for t in tokens]
        results, errors = [], []
        for future, tag in started:  # every bucket finishes before an error is raised: none left half-issued
            try:
                results.append(future.result())
            except MismatchError as e:
                errors.append(tag.explained(e, name))
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]
        out: list[np.ndarray] = [np.empty(0)] * len(inputs)
        for members, reduced in zip(buckets, results, strict=True):
            for i, r in zip(members, reduced, strict=True):
                out[i] = r
        return out

    gate = [] if overlap else inputs
    with tf.control_dependencies(gate):  # overlap=False: every bucket waits for every gradient
        tagged = [] if hyper is None else [hyper.values]
        tokens = [numpy_call(starter(b), [*(inputs[i] for i in members), *tagged], [tf.int64], f"{name}.b{b}")[0]
                  for b, members in enumerate(buckets)]
    outs = numpy_call(finish, tokens, [x.dtype for x in inputs], f"{name}.finish")
    for o, x in zip(outs, inputs, strict=True):
        o.set_shape(x.shape)
    return outs
