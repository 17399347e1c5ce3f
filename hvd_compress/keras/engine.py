"""The engine each Keras wrapper holds as ``self._hvdc``: ``hck.DistributedOptimizer`` of Keras 3
(``keras.optimizer``) and of tf_keras (``keras.legacy``) are one engine under two Keras APIs.

The engine takes ``op`` and its options, makes and keeps the wrapper's state (an algorithm's or a stateful
reduction's variables, the gradient sums of ``backward_passes_per_step``) and runs one step per op
(``keras.wrapped_step``, ``tensorflow.algorithm_step``). A wrapper supplies what its Keras version spells its own
way (a ``Face``: which optimizers an algorithm wraps, how the inner optimizer applies gradients, the learning rate of
this step) and the Keras hooks around the engine (``build``, ``apply``/``apply_gradients``, the config).
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress import ops
from hvd_compress.algorithms.options import option_names
from hvd_compress.keras import per_rank_state
from hvd_compress.keras.wrapped_step import (
    accumulate_then_step,
    adasum_delta_step,
    apply_constraints,
    check_base_options,
    check_passes,
    clip_local_gradients,
    compression_config,
    error_feedback_step,
    hyper_values,
    max_of_overwritten,
    parse_compression,
    parse_op,
    per_rank_variables,
    rank_bound_keys,
    reset_error_feedback,
    stateful_reduction,
    synchronize_parameters,
    with_maxed,
)
from hvd_compress.ops.compression import Compression
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import warn_per_rank_state
from hvd_compress.ops.horovod_args import NOTE
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import apply_algorithm_step, make_step
from hvd_compress.tensorflow.bucketed import BucketStats, bucketed_allreduce, none_gradients_left_out
from hvd_compress.tensorflow.context import ensure_init
from hvd_compress.tensorflow.diloco import KerasDiLoCo
from hvd_compress.tensorflow.functions import dense, numpy_call

#: The ``.keras`` store entry beside the optimizer's variables naming the rank that saved them
#: (``EngineMethods.save_own_variables``).
SAVED_BY = "hvdc_saved_by"
#: The wrapper's attribute holding the rank that owns its error feedback (``EngineMethods._stamp_owner``): a
#: ``tf.Variable`` outside ``variables`` (``.keras`` files keep their entries), which ``tf.train.Checkpoint`` saves
#: and restores with the rest, so a step can tell that the state came from another rank's checkpoint.
OWNER = "_hvdc_saved_by"
#: The config entry of the variables excluded from weight decay (``KerasEngine.config_entries``), which the
#: wrapper's constructor takes back among its keyword arguments when ``from_config`` rebuilds it.
EXCLUDED = "weight_decay_excluded"
#: (op name, inner optimizer, the LAMB options given) -> (the hyper-parameters after lr, the rule's flags).
Reader = Callable[[str, Any, dict[str, Any]], tuple[list[Any], dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Face:
    """What a Keras version spells its own way. ``readers``: per kind an algorithm wraps
    (``algorithms.contract.Wraps``) its optimizers' hyper-parameters after lr and the rule's flags, or a
    TypeError/ValueError for an optimizer of another kind; a reader takes the LAMB options given only where the
    optimizer or the rule is a LAMB (it returns them among the flags). ``apply_inner(inner, grads, variables)``:
    the inner optimizer's step; ``learning_rate(inner)``: its learning rate for this step; ``method``: the wrapper
    method a step is called through (for messages)."""

    readers: dict[str, Reader]
    apply_inner: Callable[[Any, list[Any], list[Any]], Any]
    learning_rate: Callable[[Any], Any]
    method: str


#: Every engine alive in this process: what a broadcast of variables must leave as each rank has them
#: (``per_rank_ids``). Weak, so that an optimizer goes when its user drops it.
_ENGINES: weakref.WeakSet[KerasEngine] = weakref.WeakSet()


def per_rank_ids() -> set[int]:
    """The ids of the ``per_rank_variables`` of every hvd_compress Keras optimizer alive in this process."""
    return {id(v) for engine in list(_ENGINES) for v in engine.per_rank_variables()}


class KerasEngine:
    """``op`` (validated at construction, alike on every rank) around the Keras optimizer ``inner``."""

    def __init__(self, inner: Any, op: Any, backward_passes_per_step: int, compression: Any,
                 algorithm_options: dict[str, Any], face: Face, name: str) -> None:
        # The variables (by index in ``build``'s list) a saved optimizer excluded from weight decay: Keras's
        # config does not keep them, and a reloaded model's variable paths are not the saved ones.
        self.restored_exclusions = [int(i) for i in algorithm_options.pop(EXCLUDED, [])]
        config = parse_op(op, algorithm_options)
        self.passes = check_passes(backward_passes_per_step)
        self.compressor, self.stateful = parse_compression(compression, config, inner, "hck.DistributedOptimizer")
        self.compression = self.stateful or self.compressor or Compression.none
        self.inner, self.face, self.name, self.config = inner, face, name, config
        self.algorithm = config.algorithm
        # process_set (the global set, checked) is no option to keep: get_config must stay plain data
        self.options = {k: v for k, v in algorithm_options.items() if k != "process_set"}
        self.meter = CommMeter()
        self.buckets = BucketStats()  # Average/Sum: the gradient buckets started so far
        self.reduction: Any = None  # a reduction with state (top-k/random-k, PowerSGD): ``stateful_reduction``
        self.runner: Any = None  # an algorithm's step: ``tensorflow.algorithm_step``
        self.local: KerasDiLoCo | None = None  # op=DiLoCo's schedule: ``tensorflow.diloco``
        self.state: dict[str, Any] = {}
        self.accumulators: list[Any] = []
        self.pass_count: Any = None
        self.trainable: list[Any] = []
        self.stepped: list[Any] = []  # an algorithm's variables in its runner's order (``build``)
        self.decay_excluded: list[int] = []  # ``_decay_excluded`` at build: the order the runner's state is in
        self.built = False
        self.owner: Any = None  # the wrapper's ``OWNER`` variable, where the op has error feedback
        #: Every rank's per-rank values: as gathered for rank 0's save, and as a file loaded them for the broadcast
        #: callback (``keras.per_rank_state``)
        self.gathered: per_rank_state.Gathered | None = None
        self.loaded: per_rank_state.Gathered | None = None
        if self.algorithm is not None:
            self.hyper, self.flags = self._hyper_flags()
        _ENGINES.add(self)

    def _hyper_flags(self) -> tuple[list[Any], dict[str, Any]]:
        """The hyper-parameters after lr as read from the inner optimizer (lr at run time: schedules act) and the
        rule's flags. Translation only: the update rule is the algorithm's (torch's Adam form: eps added to
        sqrt(v_hat)). LAMB options where neither the optimizer nor the rule is a LAMB are refused, as the torch
        face refuses them (they would change nothing)."""
        algorithm, inner, given = self.algorithm, self.inner, self.config.lamb_opts
        check_base_options(algorithm.name, inner)
        hyper, flags = self.face.readers[algorithm.wraps.kind](algorithm.name, inner, given)
        unused = sorted(set(given) - set(flags))
        if unused:
            raise TypeError(f"op={algorithm.name} got unknown options {unused} (LAMB's, and the wrapped "
                            f"{type(inner).__name__} is no LAMB); it takes "
                            f"{', '.join(option_names(algorithm.options_cls))}, {NOTE}")
        return hyper, flags

    # -- state -------------------------------------------------------------------------------------------
    def build(self, var_list: Sequence[Any], add_variable: Callable[..., Any],
              add_variable_from_reference: Callable[[Any, str], Any]) -> None:
        """Make the wrapper's variables through its own ``add_variable(shape=, dtype=, initializer=, name=)`` and
        ``add_variable_from_reference(model_variable, name)`` (one signature in both Keras versions), and build
        the inner optimizer where it steps on its own variables."""
        ensure_init()
        var_list = list(var_list)
        self.trainable = var_list
        if self.restored_exclusions:  # as saved (``config_entries``), with what the inner optimizer excludes now
            chosen = set(self.restored_exclusions) | set(self._excluded(var_list))
            self.inner.exclude_from_weight_decay(var_list=[v for i, v in enumerate(var_list) if i in chosen])
        if self.passes > 1:
            self.pass_count = add_variable(shape=(), dtype="int64", initializer="zeros", name="hvdc_passes")
            self.accumulators = [add_variable_from_reference(v, "hvdc_accumulated_grad") for v in var_list]
        if self.stateful is not None or self.config.reduction is not None:
            what = f"op={self.config.op.name}" if self.stateful is None else f"compression={self.stateful!r}"
            _check_float32(var_list, what)
            if self.stateful is not None:
                _check_not_overwritten(var_list, what)
            self.reduction = stateful_reduction(self.config, self.stateful, [tuple(v.shape) for v in var_list],
                                                self.meter)
            self.state = self._make_state(self.reduction.state_shapes(), add_variable)
        if self.config.local is not None:
            _check_float32(var_list, f"op={self.config.op.name}")
            _check_not_overwritten(var_list, f"op={self.config.op.name}")
            self.local = KerasDiLoCo(self.config.options, [tuple(v.shape) for v in var_list], self.meter, self.name)
            self.state = self._make_state(self.local.state_shapes(), add_variable)
        if self.algorithm is None:
            self.inner.build(var_list)
        else:
            _check_float32(var_list, f"op={self.config.op.name}")
            _check_not_overwritten(var_list, f"op={self.config.op.name}")
            # The variables excluded from weight decay first, as the torch face's param groups [no decay, decay]
            self.hyper, self.flags = self._hyper_flags()  # as set now (after construction too)
            self.decay_excluded = self._decay_excluded(var_list)
            first = set(self.decay_excluded)
            origin = self.decay_excluded + [i for i in range(len(var_list)) if i not in first]
            self.stepped = [var_list[i] for i in origin]
            self.runner = make_step(self.algorithm, self.config.options, [tuple(v.shape) for v in self.stepped],
                                    ops.size(), self.meter, self.config.bucket_mb, len(first), origin)
            self.state = self._make_state(self.runner.state_shapes(), add_variable)
        self.built = True

    def _excluded(self, var_list: Sequence[Any]) -> list[int]:
        """The indices of ``var_list`` that the inner optimizer excludes from weight decay
        (``exclude_from_weight_decay``, read through Keras's own test ``_use_weight_decay``)."""
        use = getattr(self.inner, "_use_weight_decay", None)
        return [] if use is None else [i for i, v in enumerate(var_list) if not use(v)]

    def _decay_excluded(self, var_list: Sequence[Any]) -> list[int]:
        """``_excluded`` where the algorithm's weight decay is not 0 (else none): the algorithm applies weight
        decay itself, so an excluded variable (a bias, a LayerNorm scale) steps in a group of its own."""
        names = self.algorithm.wraps.hyper
        decay = float(self.hyper[names.index("weight_decay")] or 0.0) if "weight_decay" in names else 0.0
        return self._excluded(var_list) if decay else []

    @staticmethod
    def _make_state(shapes: dict[str, Any], add_variable: Callable[..., Any]) -> dict[str, Any]:
        return {key: add_variable(shape=tuple(shape), dtype=dtype, initializer=init, name=f"hvdc_{key}")
                for key, (shape, dtype, init) in shapes.items()}

    def per_rank_variables(self) -> list[Any]:
        if not self.built:
            return []
        holder = self.reduction if self.reduction is not None else self.runner if self.runner is not None else \
            self.local
        keys = holder.per_rank if holder is not None else ()
        return per_rank_variables(self.config, self.inner, self.state, keys, self.accumulators)

    def _moments(self) -> tuple[str, ...]:
        if self.local is not None:
            return ("diloco_error",)
        return self.runner.rank_bound_moments() if self.runner is not None else ()

    def rank_bound(self) -> list[str]:
        """The state keys ``reset_compression_state`` zeroes (none before the build or without error feedback)."""
        if not self.built or (self.runner is None and self.reduction is None and self.local is None):
            return []
        return rank_bound_keys(self.state, self._moments())

    def per_rank_what(self) -> str:
        """``per_rank_variables`` in words, for a warning."""
        if self.runner is not None:
            return self.runner.algorithm.per_rank_what() or "local state"
        if self.config.op == ReduceOp.Adasum:
            return "optimizer moments (each rank steps on its own gradient)"
        if self.local is not None:
            return "optimizer state (each rank steps on its own gradient) and outer error feedback"
        return "error feedback"

    def rank_bound_what(self) -> str:
        """What ``reset_compression_state`` zeroes, in words for a warning: the algorithm's own words, as the torch
        face's warning has them."""
        return self.runner.algorithm.error_feedback_what() if self.runner is not None else "error feedback"

    def reset_compression_state(self) -> None:
        if self.runner is not None or self.reduction is not None or self.local is not None:
            reset_error_feedback(self.state, self._moments())
        if self.owner is not None:
            self.owner.assign(ops.rank())

    def _adopt_restored_state(self) -> None:
        """Where ``owner`` holds another rank (``tf.train.Checkpoint`` restored that rank's file, Horovod's resume),
        this rank's error feedback is that rank's residual: counted again in the ranks' sum, it would leave this
        rank's out. So it starts from zero, with a warning, as a ``.keras`` file of another rank does
        (``EngineMethods.load_own_variables``). In the step, before any state is read: one comparison a step."""
        owner = self.owner
        if owner is None:
            return
        here, what, name = ops.rank(), self.rank_bound_what(), self.name

        def warn(saved_by: np.ndarray) -> np.ndarray:
            warnings.warn(f"{name}: the optimizer state was restored from a checkpoint that rank {int(saved_by)} "
                          f"wrote; rank {here} starts its {what} from zero (the rest of the state is kept). Save and "
                          "restore each rank's own checkpoint to resume it exactly", stacklevel=2)
            return np.int64(0)

        def adopt() -> tf.Tensor:
            noted = numpy_call(warn, [owner], [tf.int64], f"{name}.restored")[0]
            with tf.control_dependencies([noted]):
                self.reset_compression_state()
            return tf.constant(True)

        tf.cond(tf.not_equal(owner, here), adopt, lambda: tf.constant(False))

    def synchronize_parameters(self) -> None:
        synchronize_parameters(self.runner, self.stepped, self.state, f"{self.name}.synchronize_parameters")

    @property
    def compression_started(self) -> bool:
        if self.runner is None:
            return False
        freeze = getattr(self.config.options, "freeze_step", 0)  # SLAMB and Birder compress from the first step
        return int(self.state["step"].numpy()) >= freeze

    def config_entries(self) -> dict[str, Any]:
        """What ``get_config`` saves beside the name and the inner optimizer; once built, the indices of the
        variables it excludes from weight decay (``EXCLUDED``), which the inner optimizer's config does not keep:
        a reloaded model would decay them again, and the algorithm's state would not fit. The constructor takes
        the entry back (``restored_exclusions``)."""
        excluded = self._excluded(self.trainable) if self.built else []
        return {"op": int(self.config.op), "backward_passes_per_step": self.passes,
                "compression": compression_config(self.compression), **self.options,
                **({EXCLUDED: excluded} if excluded else {})}

    # -- the step ----------------------------------------------------------------------------------------
    def apply(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        """One call of the wrapper's step on ``grads`` of ``variables`` (built): the step itself, or with
        ``backward_passes_per_step`` the local sum and the step on every k-th call."""
        grads, variables = list(grads), list(variables)
        if self.passes == 1:
            self.step(grads, variables)
            return
        index = {id(v): i for i, v in enumerate(self.trainable)}
        accumulators = [self.accumulators[index[id(v)]] for v in variables]
        accumulate_then_step(grads, variables, accumulators, self.pass_count, self.passes, self.step,
                             self.config.average_passes)

    def _apply_inner(self, grads: list[Any], variables: list[Any]) -> Any:
        return self.face.apply_inner(self.inner, grads, variables)

    def step(self, grads: list[Any], variables: list[Any]) -> None:
        self._adopt_restored_state()
        if self.local is not None:  # each rank's own gradients, then DiLoCo's schedule
            self.local.step(grads, variables, self.trainable, self.state, self._apply_inner, self.name)
            return
        if self.runner is not None:  # the algorithms refuse overwritten variables (_check_not_overwritten)
            self._algorithm_step(grads, variables)
            return
        # float8's scales and amax histories: the Max over ranks, applied with the others (max_of_overwritten)
        maxed = max_of_overwritten(grads, variables, f"{self.name}.overwritten", self.meter)
        apply_inner = with_maxed(self._apply_inner, maxed)
        config = self.config
        # Adasum's ranks end on the same parameters whatever their hyper-parameters: only the averages are tagged
        tags = self.reduction is not None or config.op in (ReduceOp.Average, ReduceOp.Sum)
        hyper = hyper_values(self.face.learning_rate(self.inner), self.inner, config.op.name) if tags else None
        if self.reduction is not None:  # its state covers every variable: the maxima replace what it reduced
            error_feedback_step(self.reduction, self.state, grads, variables, self.trainable, apply_inner, self.name,
                                hyper)
            return
        pairs = [(dense(g), v) for g, v in zip(grads, variables, strict=True) if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        left_out = len(grads) - len(pairs)
        pairs = [(g, v) for g, v in pairs if id(v) not in maxed]
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if config.op in (ReduceOp.Average, ReduceOp.Sum):
            reduced = []
            if grads:
                with none_gradients_left_out(left_out):
                    reduced = bucketed_allreduce(grads, config.op, f"{self.name}.grad", self.compressor,
                                                 config.bucket_mb, config.overlap, self.buckets, self.meter,
                                                 config.predivide, hyper)
            apply_inner(reduced, variables)
            return
        adasum_delta_step(grads, variables, apply_inner, config, self.meter, f"{self.name}.adasum")

    def _algorithm_step(self, grads: list[Any], variables: list[Any]) -> None:
        if sorted(id(v) for v in variables) != sorted(id(v) for v in self.trainable):
            raise ValueError(f"op={self.config.op.name}: {self.face.method}() must get every variable the optimizer "
                             "was built with")
        # The inner optimizer's hyper-parameters as they are when the step is traced (Keras's own optimizers read
        # theirs there too), so that one set after wrapping counts.
        self.hyper, self.flags = self._hyper_flags()
        if self._decay_excluded(self.trainable) != self.decay_excluded:
            raise ValueError(f"op={self.config.op.name}: the inner optimizer's exclude_from_weight_decay() (or its "
                             "weight_decay, from or to 0) changed after its first step; the algorithm's state is laid "
                             "out by it: set it before")
        grads = clip_local_gradients(self.inner, unscaled(self.inner, grads))
        by_var = {id(v): g for g, v in zip(grads, variables, strict=True)}
        hyper = [self.face.learning_rate(self.inner), *self.hyper]
        apply_algorithm_step(self.runner, self.state, self.stepped, by_var, hyper, self.flags,
                             f"{self.name}.{self.algorithm.name}", self.config.overlap)
        apply_constraints(self.stepped)
        self.inner.iterations.assign_add(1)


def unscaled(inner: Any, grads: list[Any]) -> list[Any]:
    """``grads`` divided by the inner optimizer's ``loss_scale_factor`` (Keras 3's fixed loss scale), where an
    algorithm steps in place of its ``apply``, which would divide them first: the wrapper's ``scale_loss`` scaled the
    loss by it (``DistributedOptimizer.loss_scale_factor`` is the inner optimizer's)."""
    scale = getattr(inner, "loss_scale_factor", None)
    return grads if scale is None else [None if g is None else dense(g) / scale for g in grads]


def _check_float32(variables: Sequence[Any], what: str) -> None:
    bad = [getattr(v, "path", None) or v.name for v in variables if tf.as_dtype(v.dtype) != tf.float32]
    if bad:
        raise ValueError(f"{what} supports float32 variables (mixed_float16 keeps them), not {bad}")


def _check_not_overwritten(variables: Sequence[Any], what: str) -> None:
    """Keras overwrites a variable with ``overwrite_with_gradient`` by its gradient (the scales and amax histories
    of float8 training, ``model.quantize("float8")``): an algorithm would step it as a parameter, an error
    feedback would carry its values into later steps."""
    bad = [getattr(v, "path", None) or v.name for v in variables if getattr(v, "overwrite_with_gradient", False)]
    if bad:
        named = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{what}: {named} are overwritten with their gradient (overwrite_with_gradient: Keras's "
                         f"float8 training), which {what} would change as parameters; use op=Average, Adasum or "
                         "PowerSGD")


def inner_attribute(name: str, why: str) -> property:
    """A property of the wrapper that is the inner optimizer's ``name``. The Keras base's own ``__init__`` sets it
    (to None) before the wrapper holds the inner optimizer: that assignment is not the user's, and is dropped."""

    def get(self: Any) -> Any:
        inner = vars(self).get("inner_optimizer")
        return None if inner is None else getattr(inner, name)

    def put(self: Any, value: Any) -> None:
        inner = vars(self).get("inner_optimizer")
        if inner is not None:
            setattr(inner, name, value)

    return property(get, put, doc=f"The inner optimizer's ``{name}`` ({why}).")


class EngineMethods:
    """The public methods both Keras wrappers share, each the engine's (``self._hvdc``). Listed before the Keras
    base class, so that ``learning_rate`` and ``iterations`` are the inner optimizer's, as in Keras's own
    ``LossScaleOptimizer``."""

    _hvdc: KerasEngine
    inner_optimizer: Any

    def _hold(self, engine: KerasEngine) -> None:
        """Keep ``engine`` and the wrapper's public attributes of it (after the Keras base's ``__init__``)."""
        self._hvdc = engine
        self.inner_optimizer = engine.inner
        self.op = engine.config.op
        self.backward_passes_per_step = engine.passes
        self.compression = engine.compression
        self.algorithm_options = engine.options

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, variable: Any) -> None:
        self.inner_optimizer.iterations = variable

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    # Set on the wrapper, as on Horovod's (a subclass of the optimizer), they reach the inner optimizer, which
    # clips and decays under op=Average, Adasum and PowerSGD; the algorithm ops clip by its rule
    # (``clip_local_gradients``) and read its weight decay when their step is traced.
    clipnorm = inner_attribute("clipnorm", "clipping")
    global_clipnorm = inner_attribute("global_clipnorm", "clipping")
    clipvalue = inner_attribute("clipvalue", "clipping")
    weight_decay = inner_attribute("weight_decay", "which it or the algorithm applies")

    def exclude_from_weight_decay(self, var_list: Any = None, var_names: Any = None) -> None:
        """The inner optimizer's (which applies the weight decay, or hands it to the algorithm): Horovod's Keras
        wrapper is a subclass of the optimizer, so scripts call this on the wrapper. Before the first step, as
        Keras requires of its own optimizers."""
        if self._hvdc.built:
            raise ValueError("exclude_from_weight_decay() can only be configured before the optimizer is built "
                             "(its first step)")
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer's reductions and algorithm steps since the last
        call (inside ``hck.LossScaleOptimizer``, its finite checks' too)."""
        return self._hvdc.meter.take()

    @property
    def compression_started(self) -> bool:
        """True once an algorithm's steps use the compressed collective (after ``freeze_step`` steps)."""
        return self._hvdc.compression_started

    @property
    def per_rank_variables(self) -> list[Any]:
        """Variables that differ between ranks by design (the 1-bit error feedback, the server error being this
        rank's chunk; SLAMB's local m and v; Birder's moment shards; top-k/random-k's and PowerSGD's error
        feedback; the gradient sums of ``backward_passes_per_step``; with Adasum the inner optimizer's moments):
        never broadcast, saved per rank."""
        return self._hvdc.per_rank_variables()

    def _stamp_owner(self) -> None:
        """After the engine's build: where the op has error feedback, the ``OWNER`` variable, holding this rank,
        tracked by the wrapper (so ``tf.train.Checkpoint`` saves and restores it) but not among its ``variables``."""
        if self._hvdc.rank_bound():
            with tf.init_scope():
                owner = tf.Variable(ops.rank(), dtype=tf.int64, trainable=False, name="hvdc_saved_by")
            setattr(self, OWNER, owner)  # an attribute: the wrapper tracks it
            self._hvdc.owner = owner

    def gather_per_rank_state(self) -> None:
        """A collective, every rank calls it before rank 0's ``model.save`` (``GatherPerRankStateCallback`` does
        before ``ModelCheckpoint``): every rank's ``per_rank_variables`` as of this step go into that save, so
        that ``load_model`` of rank 0's one file, on every rank or on rank 0 followed by the broadcast callback,
        resumes every rank bit for bit (``hvd_compress.keras.per_rank_state``). ``model.save`` stays local."""
        self._hvdc.gathered = per_rank_state.gather(self)

    def save_own_variables(self, store: Any) -> None:
        """Keras's ``.keras`` saving, and where this wrapper has error feedback the rank that wrote it
        (``SAVED_BY``), so that a load on another rank can tell that the error feedback is not its own; after
        ``gather_per_rank_state()`` at this step, every rank's per-rank variables too."""
        super().save_own_variables(store)  # type: ignore[misc]
        if self._hvdc.rank_bound():
            store[SAVED_BY] = np.asarray(ops.rank(), np.int64)
        per_rank_state.save(self, self._hvdc.gathered, store)

    def load_own_variables(self, store: Any) -> None:
        """Keras's ``.keras`` loading. A file another rank wrote holds that rank's error feedback: counted again
        in the ranks' sum, it would leave this rank's out, so this rank starts its own from zero, with a warning
        (``reset_compression_state``; as the torch face's ``load_state_dict``). Files without ``SAVED_BY`` (no
        error feedback, or written before it was recorded) load as written. A file that holds every rank's part
        (``gather_per_rank_state``) gives this rank its own, and keeps them all for the broadcast callback."""
        keys = list(store.keys())
        own = {k: store[k] for k in keys if k != SAVED_BY and not per_rank_state.ours(k)}
        super().load_own_variables(own)  # type: ignore[misc]
        if len(own) != len(self.variables):  # type: ignore[attr-defined]
            return  # Keras warned and loaded nothing
        loaded = self._hvdc.loaded = per_rank_state.load(self, store)
        if SAVED_BY not in keys or loaded.values:  # this rank's own part, or no error feedback
            loaded.own = bool(loaded.values)
            return
        saved_by = int(np.asarray(store[SAVED_BY]))
        here = ops.rank()
        loaded.own = saved_by == here
        if saved_by != here and self._hvdc.rank_bound():
            warn_per_rank_state(f"{type(self).__name__}.load_own_variables: the file was written by rank {saved_by}; "
                          f"rank {here} starts its {self._hvdc.rank_bound_what()} from zero (the rest of the state "
                          "is loaded). For an exact resume, every rank calls opt.gather_per_rank_state() before "
                          "rank 0's model.save, or each rank saves and loads its own file", stacklevel=2)
            self.reset_compression_state()

    def reset_compression_state(self) -> None:
        """Zero the error feedback (worker and server error of 1-bit Adam/LAMB and Birder, top-k/random-k's error
        and velocity, PowerSGD's error), and hierarchical Birder's m and b with more than one rank per node (this
        rank's chunk's only): what a rank does when it resumes from a checkpoint that another rank saved (the error
        buffers are per rank). SLAMB keeps no error buffer (its compensation is the local part of m)."""
        self._hvdc.reset_compression_state()

    def synchronize_parameters(self) -> None:
        """SLAMB: average the trainable variables over all ranks now (one dense allreduce), where the last step
        was not a multiple of ``sync_interval`` (end of training, before evaluating or saving). 0/1 Adam: the same,
        ending the local interval there (spec Z20): between syncs (the step after a change to the variables does it
        itself). Other ops keep the parameters alike on every rank after every step: nothing to do. Eager or inside
        a ``tf.function``."""
        self._hvdc.synchronize_parameters()
