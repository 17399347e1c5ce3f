"""The pieces of one step of ``hck.DistributedOptimizer`` that ``hvd_compress.keras.engine`` runs for both Keras
wrappers (Keras 3's ``hvd_compress.keras.optimizer``, tf_keras's ``hvd_compress.keras.legacy``): the op parsing,
Adasum of the parameter deltas, the top-k/random-k step and the local accumulation over
``backward_passes_per_step``. The algorithms' math stays in ``hvd_compress.algorithms`` (run by
``hvd_compress.tensorflow.algorithm_step``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress import algorithms
from hvd_compress.algorithms.adasum_delta import (
    AdasumDelta,
    AdasumOptions,
    DeltaBucket,
    plan_buckets,
)
from hvd_compress.algorithms.options import BUCKET_OPTIONS, option_names, parse_options
from hvd_compress.ops import compression as compression_ops
from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB
from hvd_compress.ops.collectives import check_predivide
from hvd_compress.ops.compression import Compression, Compressor
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.horovod_args import NOTE, pop_horovod_defaults
from hvd_compress.ops.process_sets import check_process_set
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import FusedStep, SlambStep, ZeroOneStep
from hvd_compress.tensorflow.backend import BACKEND, aligned_copy, aligned_empty
from hvd_compress.tensorflow.bucketed import HyperValues, check_bucket_mb, check_overlap
from hvd_compress.tensorflow.error_feedback import ErrorFeedbackReduction, check_inner_momentum
from hvd_compress.tensorflow.functions import (
    check_group_compression,
    check_not_xla,
    dense,
    numpy_call,
    reduced_group,
)
from hvd_compress.tensorflow.powersgd import PowerSGDReduction
from hvd_compress.tensorflow.stateful_reduction import StatefulReduction

LAMB_DEFAULTS = {"min_coeff": 0.01, "max_coeff": 10.0, "bias_correction": True}  # as hc.Lamb (torch face)
#: The kinds (``algorithms.contract.Wraps``) whose Keras optimizer may be a Lamb, so take ``LAMB_DEFAULTS``' options
#: (a face's reader refuses them where neither the optimizer nor the rule is a LAMB: ``keras.engine``).
LAMB_KINDS = ("adam", "lamb", "slamb-lamb")
#: What reaches the update of Keras's optimizers (both Kerases') beside the learning rate: those an inner optimizer
#: has must be equal on every rank under op=Average/Sum/PowerSGD (``hyper_values``).
KERAS_HYPER = ("momentum", "nesterov", "beta_1", "beta_2", "epsilon", "rho", "centered", "amsgrad", "weight_decay",
               "initial_accumulator_value", "clipnorm", "clipvalue", "global_clipnorm")
#: Options of the base optimizer that an algorithm's own step would silently ignore: refused instead. (Its
#: clipnorm, clipvalue and global_clipnorm are applied: ``clip_local_gradients``.)
BASE_ONLY = ("use_ema", "gradient_accumulation_steps")


@dataclass
class OpConfig:
    """``op`` and its options, validated: ``algorithm`` (a class of ``algorithms.REGISTRY``) with its parsed
    ``options``, the LAMB options given and its buckets (``bucket_mb``, ``overlap``: ``tensorflow.algorithm_step``), or
    Adasum's bucket size and hierarchy, or the gradient buckets of Average/Sum (``bucket_mb``, ``overlap``:
    ``hvd_compress.tensorflow.bucketed``; Horovod's ``gradient_predivide_factor`` as ``predivide``)."""

    op: ReduceOp | AlgorithmOp
    algorithm: type | None = None
    options: Any = None
    lamb_opts: dict[str, Any] = field(default_factory=dict)
    bucket_mb: float = DEFAULT_BUCKET_MB
    hierarchical: Any = None
    overlap: bool = True
    predivide: float = 1.0
    average_passes: bool = False
    reduction: type | None = None  # an algorithm that is a reduction with state (``stateful_reduction``)
    local: type | None = None  # an algorithm of local steps and scheduled syncs (op=DiLoCo: ``tensorflow.diloco``)


def check_passes(backward_passes_per_step: Any) -> int:
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or \
            backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
    return backward_passes_per_step


def parse_op(op: Any, algorithm_options: dict[str, Any]) -> OpConfig:
    """Validate ``op`` (``algorithms.resolve_op``) and its options; raises TypeError/ValueError on bad ones.
    Horovod's ``process_set`` (the global set only), ``average_aggregated_gradients``, ``sparse_as_dense`` (the
    Keras faces densify ``IndexedSlices`` either way) and its other arguments at their defaults
    (``ops.horovod_args``) are taken with every op; ``gradient_predivide_factor`` other than 1.0 with Average
    only. Every message names all the options the op takes."""
    op = algorithms.resolve_op(op)
    options = dict(algorithm_options)
    check_process_set(options.pop("process_set", None))
    average_passes = options.pop("average_aggregated_gradients", False)
    if not isinstance(average_passes, bool):
        raise TypeError(f"average_aggregated_gradients must be True or False, got {average_passes!r}")
    if not isinstance(options.pop("sparse_as_dense", False), bool):
        raise TypeError("sparse_as_dense must be True or False")
    what = f"hck.DistributedOptimizer(op={op.name})"
    if op in (ReduceOp.Average, ReduceOp.Sum):
        takes = ["bucket_mb", "overlap", "gradient_predivide_factor", "sparse_as_dense", "compression"]
        pop_horovod_defaults(options, what, keep=("gradient_predivide_factor",), takes=takes)
        bucket_mb = check_bucket_mb(options.pop("bucket_mb", DEFAULT_BUCKET_MB))
        overlap = check_overlap(options.pop("overlap", True))
        predivide = check_predivide(options.pop("gradient_predivide_factor", 1.0), op)
        if options:
            raise TypeError(f"op={op.name} takes {', '.join(takes)}, {NOTE}; got {sorted(options)}")
        return OpConfig(op, bucket_mb=bucket_mb, overlap=overlap, predivide=predivide, average_passes=average_passes)
    if op == ReduceOp.Adasum:
        pop_horovod_defaults(options, what, takes=option_names(AdasumOptions, ()))
        parsed = parse_options(AdasumOptions, op.name, options, also=())
        return OpConfig(op, bucket_mb=float(parsed.bucket_mb), hierarchical=parsed.hierarchical,
                        average_passes=average_passes)
    algorithm = algorithms.lookup(op)
    if algorithm.buffers == "local":  # no gradient reduction: local steps, fragments synced on a schedule
        pop_horovod_defaults(options, what, takes=option_names(algorithm.options_cls, ()))
        return OpConfig(op, local=algorithm, options=algorithms.parse(op, options, ()), average_passes=average_passes)
    if algorithm.buffers == "lowrank":  # a reduction with state over one bucket (``stateful_reduction``)
        pop_horovod_defaults(options, what, takes=option_names(algorithm.options_cls, ()))
        return OpConfig(op, reduction=algorithm, options=algorithms.parse(op, options, ()),
                        average_passes=average_passes)
    # The wrapped LAMB's trust-ratio bounds (kinds that may wrap a Lamb) and the algorithm's buckets, reduced while
    # backward runs (``tensorflow.algorithm_step``), cut as op=Average's: the face's options beside the algorithm's.
    lamb = algorithm.wraps.kind in LAMB_KINDS
    face_options = (*(tuple(LAMB_DEFAULTS) if lamb else ()), *BUCKET_OPTIONS)
    pop_horovod_defaults(options, what, takes=option_names(algorithm.options_cls, face_options))
    lamb_opts = {k: options.pop(k) for k in LAMB_DEFAULTS if k in options} if lamb else {}
    buckets = {"bucket_mb": check_bucket_mb(options.pop("bucket_mb", DEFAULT_BUCKET_MB)),
               "overlap": check_overlap(options.pop("overlap", True))}
    parsed = algorithms.parse(op, options, face_options)
    return OpConfig(op, algorithm=algorithm, options=parsed, lamb_opts=lamb_opts, average_passes=average_passes,
                    **buckets)


def lamb_flags(given: dict[str, Any]) -> dict[str, Any]:
    """The flags of a LAMB rule: the LAMB options ``given``, ``LAMB_DEFAULTS`` for the others."""
    return {**LAMB_DEFAULTS, **given}


def per_rank_variables(config: OpConfig, inner: Any, state: dict[str, Any], per_rank_keys: Sequence[str],
                       accumulators: Sequence[Any]) -> list[Any]:
    """The variables of a wrapper that differ between ranks by design, for both Keras wrappers: the state keys
    ``per_rank_keys`` (error feedback, SLAMB's local moments, Birder's shards), the gradient sums of
    ``backward_passes_per_step`` (each rank's own gradients), and with Adasum every variable of the inner optimizer
    but its step counter and learning rate (each rank steps it on its own gradient: its moments are that rank's).
    A broadcast from one rank must leave them alone, so that a resume from per-rank checkpoints stays exact."""
    out = [state[k] for k in per_rank_keys if k in state] + list(accumulators)
    if config.op == ReduceOp.Adasum or config.local is not None:
        alike = {id(v) for v in (inner.iterations, getattr(inner, "_learning_rate", None)) if v is not None}
        out += [v for v in inner.variables if id(v) not in alike]
    return out


def parse_compression(compression: Any, config: OpConfig, inner: Any, name: str) -> tuple[Compressor | None,
                                                                                       Compressor | None]:
    """``compression=`` of a wrapper: (the stateless compressor of the bucketed reduction, none: None; the
    top-k/random-k compressor, whose error feedback the wrapper keeps in its variables, or None). ValueError on
    bad ones, at construction (alike on every rank)."""
    compressor, op = compression_ops.resolve(compression), config.op
    if not compressor.stateful:
        return check_group_compression(compression, op, name), None
    if op not in (ReduceOp.Average, ReduceOp.Sum):
        raise ValueError(f"{name}: compression={compressor!r} needs op=Average or Sum, got {op.name}")
    if config.predivide != 1.0:
        raise ValueError(f"{name}: gradient_predivide_factor does not apply to compression={compressor!r}")
    check_inner_momentum(compressor, inner)
    return None, compressor


def stateful_reduction(config: OpConfig, compressor: Compressor | None, shapes: Sequence[tuple[int, ...]],
                       meter: CommMeter) -> ErrorFeedbackReduction | PowerSGDReduction | None:
    """The gradient reduction of a wrapper that keeps state in its variables (``state_shapes``): top-k/random-k's
    error feedback (``compressor``), or an algorithm of ``lowrank`` buffers (op=PowerSGD); None for the others."""
    if config.reduction is not None:
        return PowerSGDReduction(config.options, shapes, meter)
    return None if compressor is None else ErrorFeedbackReduction(compressor, config.op, shapes, meter)


def compression_config(compressor: Compressor) -> Any:
    """``compression`` as ``get_config`` saves it: the kind (none, fp16, bf16) or top-k/random-k's description."""
    return compressor.describe() if compressor.stateful else compressor.kind


def compression_from_config(value: Any) -> Compressor:
    """The inverse of ``compression_config`` (a config from before top-k/random-k holds the kind only)."""
    if isinstance(value, str):
        return getattr(Compression, value)
    desc = dict(value)
    kind = desc.get("kind")
    if kind == "topk":
        return Compression.topk(desc["ratio"], desc.get("momentum", 0.0), desc.get("momentum_masking", True),
                                desc.get("clip_norm", 0.0), desc.get("warmup_steps", 0), desc.get("warmup_stages", 4),
                                desc.get("dense_steps", 0))
    if kind == "randomk":
        return Compression.randomk(desc["ratio"], desc["seed"])
    raise ValueError(f"unknown compression in the optimizer's config: {value!r}")


def hyper_values(learning_rate: Any, inner: Any, op: str = "") -> HyperValues:
    """The wrapped optimizer's learning rate as the step runs (``learning_rate``: a tensor of this trace) and each of
    ``KERAS_HYPER`` it has as a number, for the tag of the reductions' call names: ranks whose values differ (a
    ``ReduceLROnPlateau`` fed one rank's own metric) would step apart on the same averaged gradients, and raise
    MismatchError on every rank instead (``algorithms.agreement``). ``op``: the op, named in the tag's details."""
    names, values = ["learning_rate"], [tf.cast(learning_rate, tf.float64)]
    for key in KERAS_HYPER:
        value = getattr(inner, key, None)
        if value is None or callable(value):
            continue
        try:
            values.append(tf.cast(value, tf.float64))
        except (TypeError, ValueError):  # no number: left out
            continue
        names.append(key)
    return HyperValues(tuple(names), tf.stack(values), (("op", op),) if op else ())


def error_feedback_step(reduction: StatefulReduction, state: dict[str, Any], grads: Sequence[Any],
                        variables: Sequence[Any], built_with: Sequence[Any],
                        apply_inner: Callable[[list[Any], list[Any]], Any], name: str,
                        hyper: HyperValues | None = None) -> None:
    """A reduction with state (top-k/random-k: ``hvd_compress.tensorflow.error_feedback``; PowerSGD): the fused
    reduction of the gradients of all the variables the wrapper was ``built_with``, then ``apply_inner`` on those
    that have a gradient. ``hyper`` tags its call names (``hyper_values``)."""
    by_var = {id(v): g for g, v in zip(grads, variables, strict=True)}
    if sorted(by_var) != sorted(id(v) for v in built_with):
        raise ValueError(f"{name}: with {reduction.what} every step must get every variable the optimizer was built "
                         "with (the error feedback covers them all)")
    ordered = [by_var[id(v)] for v in built_with]
    if all(g is None for g in ordered):
        raise ValueError("No gradients provided for any variable.")
    reduced = reduction.reduce(ordered, built_with, state, f"{name}.grad", hyper)
    pairs = [(r, v) for r, v, g in zip(reduced, built_with, ordered, strict=True) if g is not None]
    apply_inner([r for r, _ in pairs], [v for _, v in pairs])


def check_sgd(op_name: str, inner: Any, sgd: type) -> tuple[list[Any], dict[str, Any]]:
    """The "sgd" kind (``algorithms.contract.SGD``): ``sgd`` (the face's SGD) with lr alone, as the algorithm reads
    nothing else (momentum, nesterov or weight decay would be silently dropped). No hyper-parameters after lr."""
    if not isinstance(inner, sgd):
        raise TypeError(f"op={op_name} wraps {sgd.__module__.split('.')[0]}.optimizers.SGD, got {type(inner).__name__}")
    for name in ("momentum", "weight_decay"):
        if float(getattr(inner, name, 0) or 0) != 0:
            raise ValueError(f"op={op_name}: wrap SGD with {name}=0 (op={op_name} reads only lr)")
    if getattr(inner, "nesterov", False):
        raise ValueError(f"op={op_name}: wrap SGD with nesterov=False")
    return [], {}


def check_base_options(op_name: str, inner: Any) -> None:
    for name in BASE_ONLY:
        if getattr(inner, name, None) not in (None, False):
            raise ValueError(f"op={op_name}: the inner optimizer's {name} is not applied by the algorithm; unset it")


def clip_local_gradients(inner: Any, grads: list[Any]) -> list[Any]:
    """``grads`` clipped by the inner optimizer's own ``clipnorm``, ``global_clipnorm`` or ``clipvalue`` (Keras's
    ``_clip_gradients``, the same in both Keras versions), for an algorithm op, whose step takes this rank's
    gradients where Keras's ``apply`` would clip them: so each rank's gradient is clipped before the algorithm (a
    1-bit warm-up then averages the clipped gradients), as DeepSpeed's compressed stage and the torch face's
    ``overlap=False`` clip. Sparse gradients are made dense first (their norm is the dense gradient's)."""
    if not any(getattr(inner, name, None) for name in ("clipnorm", "global_clipnorm", "clipvalue")):
        return grads
    return list(inner._clip_gradients([None if g is None else dense(g) for g in grads]))


def adasum_delta_step(grads: list[tf.Tensor], variables: list[Any], apply_local: Callable[[list[Any], list[Any]], Any],
                      config: OpConfig, meter: CommMeter, name: str) -> None:
    """Local step (``apply_local(grads, variables)``: the inner optimizer's), then ``AdasumDelta`` (paper 002,
    Section 4.1) over NumPy copies of the variables: each delta into its bucket (``plan_buckets``), Adasum per
    bucket, start + reduced delta assigned back, then the variables' constraints."""
    starts = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
    with tf.control_dependencies(starts):
        apply_local(grads, variables)
    afters = [tf.convert_to_tensor(v) for v in variables]
    items = [(v.dtype, int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size) for v in variables]
    plan = plan_buckets(items, int(config.bucket_mb * (1 << 20)))
    options = AdasumOptions(hierarchical=config.hierarchical, bucket_mb=config.bucket_mb)
    count = len(variables)

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        params = [aligned_copy(np.asarray(a)) for a in arrays[:count]]
        buckets = []
        for b, members in enumerate(plan):
            sizes = [params[i].size for i in members]
            flat = aligned_empty(sum(sizes), params[members[0]].dtype)
            ends = np.cumsum(sizes)
            views = [flat[end - n:end].reshape(params[i].shape) for i, n, end in zip(members, sizes, ends, strict=True)]
            buckets.append(DeltaBucket(b, [params[i] for i in members], flat, views, sizes))
        delta = AdasumDelta(options, BACKEND, buckets, meter, prefix=name)
        delta.gradient_final(params, [np.asarray(a) for a in arrays[count:]])
        delta.synchronize()
        delta.step()
        return params

    result = numpy_call(run, afters + starts, [x.dtype for x in afters], name)
    for v, x in zip(variables, result, strict=True):
        v.assign(tf.reshape(x, v.shape))
    apply_constraints(variables)


def apply_constraints(variables: Sequence[Any]) -> None:
    """Each variable's ``constraint`` (a layer's ``kernel_constraint=MaxNorm(2)``, ``NonNeg()``), applied after an
    update as Keras's own optimizers do in ``apply``: the algorithm ops step the variables themselves, and Adasum's
    combined delta moves them after the inner optimizer applied it. Under 0/1 Adam after the freeze what they
    change counts as a change made outside the optimizer (spec Z20), as the same projection by hand would."""
    for v in variables:
        constraint = getattr(v, "constraint", None)
        if constraint is not None:
            v.assign(constraint(v))


def overwritten(variable: Any) -> bool:
    """Whether Keras overwrites ``variable`` with its gradient (``overwrite_with_gradient``: the scales and amax
    histories of float8 training, ``model.quantize("float8")``), whose "gradient" is the value this rank measured."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def max_of_overwritten(grads: Sequence[Any], variables: Sequence[Any], name: str,
                       meter: CommMeter) -> dict[int, tuple[Any, Any]]:
    """The largest over all ranks of each ``overwritten`` variable's gradient (one Max allreduce, its bytes counted
    by ``meter``: the wrapper's ``comm_stats``), by the variable's id, with the variable. Keras's own gradient
    accumulation takes the maximum of these values over steps; an average over ranks would leave a rank whose
    inputs exceed it to saturate them in float8."""
    pairs = [(dense(g), v) for g, v in zip(grads, variables, strict=True) if g is not None and overwritten(v)]
    if not pairs:
        return {}
    check_not_xla(name)
    reduced = reduced_group([g for g, _ in pairs], ReduceOp.Max, name, meter=meter)
    return {id(v): (g, v) for g, (_, v) in zip(reduced, pairs, strict=True)}


def with_maxed(apply_inner: Callable[[list[Any], list[Any]], Any],
               maxed: dict[int, tuple[Any, Any]]) -> Callable[[list[Any], list[Any]], Any]:
    """``apply_inner`` given ``maxed``'s gradients for those variables, in place of any it gets for them or beside
    the others: one inner ``apply`` per step, the overwritten variables with it."""
    if not maxed:
        return apply_inner

    def apply(grads: list[Any], variables: list[Any]) -> Any:
        pairs = {id(v): (g, v) for g, v in zip(grads, variables, strict=True)}
        pairs.update(maxed)
        return apply_inner([g for g, _ in pairs.values()], [v for _, v in pairs.values()])

    return apply


def accumulate_then_step(grads: Sequence[Any], variables: Sequence[Any], accumulators: Sequence[Any], pass_count: Any,
                         passes: int, step: Callable[[list[Any], list[Any]], Any], average: bool = False) -> None:
    """``backward_passes_per_step``: add ``grads`` to this rank's ``accumulators`` (None stays None: decided by the
    program's structure, alike on every rank) and run ``step(summed, variables)`` on every ``passes``-th call,
    then zero them (``average``: Horovod's ``average_aggregated_gradients``, the sum divided by ``passes``). The
    count is a variable, so the choice is made at run time inside a ``tf.function``. An ``overwritten`` variable's
    values are not summed but their maximum kept, as Keras's own ``gradient_accumulation_steps`` does."""
    for acc, g, v in zip(accumulators, grads, variables, strict=True):
        if g is not None:
            value = tf.cast(dense(g), v.dtype)
            if overwritten(v):
                acc.assign(tf.maximum(acc, value))
            else:
                acc.assign_add(value)
    pass_count.assign_add(1)

    def run() -> Any:
        def total(acc: Any, v: Any) -> tf.Tensor:
            t = tf.convert_to_tensor(acc)
            return t * tf.constant(1.0 / passes, t.dtype) if average and not overwritten(v) else t

        summed = [None if g is None else total(a, v) for a, g, v in zip(accumulators, grads, variables, strict=True)]
        step(summed, list(variables))
        for a in accumulators:
            a.assign(tf.zeros_like(a))
        pass_count.assign(0)
        return tf.constant(True)

    if tf.executing_eagerly():
        if int(pass_count.numpy()) >= passes:
            run()
    else:
        tf.cond(pass_count >= passes, run, lambda: tf.constant(False))


def synchronize_parameters(runner: FusedStep | None, variables: Sequence[Any], state: dict[str, Any],
                           name: str) -> None:
    """SLAMB (``runner`` a ``SlambStep``): average ``variables`` over all ranks now (one dense allreduce); 0/1 Adam
    (a ``ZeroOneStep``): the same, ending the local interval there (spec Z20: x_anchor, u and the sums of lr in
    ``state`` with it). Eager or inside a ``tf.function``; then the variables' constraints. Other runners keep the
    parameters alike after every step: nothing to do."""
    if not isinstance(runner, SlambStep | ZeroOneStep):
        return
    variables = list(variables)
    names = list(runner.state_shapes()) if isinstance(runner, ZeroOneStep) else []
    inputs = [tf.convert_to_tensor(v) for v in variables] + [tf.convert_to_tensor(state[k]) for k in names]
    touts = [tf.float32] * len(variables) + [tf.as_dtype(state[k].dtype) for k in names]
    outs = numpy_call(runner.synchronize_parameters, inputs, touts, name)
    for v, x in zip([*variables, *(state[k] for k in names)], outs, strict=True):
        v.assign(tf.reshape(x, v.shape))
    apply_constraints(variables)


def rank_bound_keys(state: dict[str, Any], moments: Sequence[str] = ()) -> list[str]:
    """The keys of ``state`` that hold this rank's own error feedback: worker and server error of 1-bit Adam/LAMB
    and Birder, or top-k/random-k's error (and DGC velocity), or PowerSGD's error; and the state keys
    ``moments`` (``FusedStep.rank_bound_moments``). Another rank's values there are wrong for this rank."""
    keys = ("worker_error", "server_error", *ErrorFeedbackReduction.per_rank, *PowerSGDReduction.per_rank, *moments)
    return [key for key in keys if key in state]


def reset_error_feedback(state: dict[str, Any], moments: Sequence[str] = ()) -> None:
    """Zero ``rank_bound_keys(state, moments)``."""
    for key in rank_bound_keys(state, moments):
        state[key].assign(tf.zeros_like(state[key]))
