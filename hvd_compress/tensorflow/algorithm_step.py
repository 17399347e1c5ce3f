"""One step of an algorithm of ``hvd_compress.algorithms`` (1-bit Adam, 1-bit LAMB, SLAMB, Birder) on NumPy copies
of a TF face's variables: the run-time half of ``hvd_compress.keras.DistributedOptimizer``.

The state lives in framework variables (so checkpoints keep it). Each step hands them, the parameters and the
gradients to ``FusedStep.__call__`` inside one ``tf.numpy_function(stateful=True)``; it copies them into
fresh 64-byte aligned arrays (TF's inputs alias its buffers and are never written), binds the algorithm's own
buffers (``Segment``, ``SlambBuffers``, ``BirderSegment``) over them, runs the algorithm's step (the same code
the torch face runs), and returns the arrays (TF adopts them without a copy; they are never touched again
here). A buffer the coming step only reads (the 1-bit ops' frozen v in the compression stage: ``read_only``) is
not copied: the algorithm gets TF's input array marked read-only, and an empty array goes back, on which the
variable is not assigned. Every step-dependent decision (warm-up or compression, trust-ratio clipping, SLAMB's
masks and sync interval) is made there, at run time. The subclasses below only say which buffers each algorithm
keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress.algorithms.birder import BirderAlgorithm, BirderOptions, BirderSegment
from hvd_compress.algorithms.onebit import OneBitAlgorithm, Segment
from hvd_compress.algorithms.slamb import Slamb, SlambBuffers, SlambOptions
from hvd_compress.ops import onebit as onebit_ops
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.backend import BACKEND, aligned_empty
from hvd_compress.tensorflow.functions import dense, numpy_call

StateShapes = dict[str, tuple[tuple[int, ...], str, str]]  # name -> (shape, dtype, Keras initializer)


def _fresh_copy(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    out = aligned_empty(x.size, dtype or x.dtype)
    np.copyto(out, np.asarray(x).reshape(-1), casting="unsafe")
    return out


def _read_only_view(x: np.ndarray) -> np.ndarray:
    """TF's input array itself, flat, marked read-only: a step that wrote it would raise, not change TF's buffer."""
    view = np.asarray(x).reshape(-1).view()
    view.flags.writeable = False
    return view


class FlatLayout:
    """Variables of ``shapes`` (in order) as one flat float32 buffer: ``flatten`` copies them in, ``views`` cuts
    the buffer back into per-variable pieces."""

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.numel = sum(self.sizes)
        offsets = np.cumsum((0, *self.sizes))
        self.cuts = list(itertools.pairwise(int(o) for o in offsets))

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat[lo:hi] for lo, hi in self.cuts]

    def flatten(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        out = aligned_empty(self.numel, np.float32)
        for (lo, hi), a in zip(self.cuts, arrays, strict=True):
            out[lo:hi] = np.asarray(a).reshape(-1)
        return out


def float32_gradients(grads: Sequence[Any], variables: Sequence[Any]) -> list[tf.Tensor]:
    """Each of ``variables``' gradient as a dense float32 tensor; None (decided by the program's structure, so alike
    on every rank) becomes zeros."""
    return [tf.zeros(v.shape, tf.float32) if g is None else tf.cast(dense(g), tf.float32)
            for g, v in zip(grads, variables, strict=True)]


class FusedStep(FlatLayout):
    """One fused float32 segment over all trainable variables (``shapes``, in order), and the algorithm that
    steps it. Subclasses name the state buffers (``state_shapes``), the ones that differ between ranks by
    design (``per_rank``), the hyper-parameter group (``group``) and bind the algorithm's buffers (``run``)."""

    #: State names that are scalars or small lists, not flat buffers copied as such.
    scalars: tuple[str, ...] = ("step",)
    per_rank: tuple[str, ...] = ()
    #: State buffers that some steps only read (``read_only``): not copied in, and not assigned back then.
    may_be_read_only: tuple[str, ...] = ()

    def __init__(self, algorithm: Any, shapes: Sequence[tuple[int, ...]]) -> None:
        super().__init__(shapes)
        self.algorithm = algorithm

    def state_shapes(self) -> StateShapes:
        raise NotImplementedError

    def group(self, hyper: np.ndarray, flags: dict[str, Any]) -> dict[str, Any]:
        """(lr, beta1, beta2, eps, weight_decay) as a param group of the torch face's Adam/LAMB."""
        lr, b1, b2, eps, wd = (float(h) for h in np.asarray(hyper, dtype=np.float64))
        return {"lr": lr, "betas": (b1, b2), "eps": eps, "weight_decay": wd, **flags}

    def read_only(self, saved: dict[str, np.ndarray]) -> frozenset[str]:
        """The names of ``may_be_read_only`` that the coming step (state ``saved``) does not write."""
        return frozenset()

    def run(self, x: np.ndarray, g: np.ndarray, bufs: dict[str, np.ndarray], saved: dict[str, np.ndarray],
            group: dict[str, Any]) -> dict[str, np.ndarray]:
        """Step the algorithm over x (parameters, flat) with gradient g and state ``bufs`` (fresh copies, updated
        in place); returns the new values of the ``scalars`` state (``saved`` holds their old ones)."""
        raise NotImplementedError

    def __call__(self, flags: dict[str, Any], hyper: np.ndarray, grads: Sequence[np.ndarray],
                 params: Sequence[np.ndarray], state: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Returns the new parameters (flat per parameter) then the new state, in ``state_shapes`` order; a state
        buffer this step only read comes back empty (``apply_algorithm_step`` then leaves its variable)."""
        x, g = self.flatten(params), self.flatten(grads)
        names = list(self.state_shapes())
        saved = dict(zip(names, state, strict=True))
        read_only = self.read_only(saved)
        bufs = {k: _read_only_view(saved[k]) if k in read_only else _fresh_copy(saved[k])
                for k in names if k not in self.scalars}
        new = self.run(x, g, bufs, saved, self.group(hyper, flags))
        new_state = {**bufs, **new, **{k: np.empty(0, saved[k].dtype) for k in read_only}}
        return [*self.views(x), *(new_state[k] for k in names)]

    def _run_segment(self, seg: Any, saved: dict[str, Any], group: dict[str, Any]) -> int:
        """One step of a segment-based algorithm (1-bit, Birder) on ``seg``, whose arrays are TF's: bound for
        this call only, the step count taken from ``saved``; returns the new step count."""
        alg = self.algorithm
        alg.segments = [seg]
        alg.t = int(saved["step"])
        try:
            alg.synchronize()
            return alg.step([group])
        finally:
            alg.segments = []  # the arrays now belong to TF


class OneBitStep(FusedStep):
    """1-bit Adam / 1-bit LAMB (``hvd_compress.algorithms.onebit``): moments, error feedback, LAMB's per-layer
    frozen coefficients."""

    scalars = ("step", "lamb_coeff_freeze", "last_factor")
    per_rank = ("worker_error", "server_error")
    # v is frozen in the compression stage (both papers' Alg. 1): read there, never written.
    may_be_read_only = ("exp_avg_sq",)

    def __init__(self, algorithm: OneBitAlgorithm, shapes: Sequence[tuple[int, ...]], world_size: int) -> None:
        super().__init__(algorithm, shapes)
        self.world_size = world_size
        self._kept: _KeptDenom | None = None
        # Working buffers, every element written before it is read in a step: made once, not per step.
        self._work = BACKEND.float32_like(self.numel, None)
        self._scratch = BACKEND.float32_like(self.numel, None)

    def state_shapes(self) -> StateShapes:
        n, layers = self.numel, len(self.sizes)
        shapes = {"exp_avg": ((n,), "float32", "zeros"), "exp_avg_sq": ((n,), "float32", "zeros")}
        if self.algorithm.has_fresh_variance:
            shapes["exp_avg_sq_fresh"] = ((n,), "float32", "zeros")
        shapes.update(
            worker_error=((n,), "float32", "zeros"),
            server_error=((onebit_ops.server_error_numel(n, self.world_size),), "float32", "zeros"),
            step=((), "int64", "zeros"),
            lamb_coeff_freeze=((layers,), "float64", "zeros"),
            last_factor=((layers,), "float64", "ones"),
        )
        return shapes

    def read_only(self, saved: dict[str, np.ndarray]) -> frozenset[str]:
        self.algorithm.t = int(saved["step"])
        return frozenset(self.may_be_read_only) if self.algorithm.compression_started else frozenset()

    def run(self, x: np.ndarray, g: np.ndarray, bufs: dict[str, np.ndarray], saved: dict[str, np.ndarray],
            group: dict[str, Any]) -> dict[str, np.ndarray]:
        seg = Segment(
            group=0, params=self.views(x), sizes=list(self.sizes), grad=g,
            exp_avg=bufs["exp_avg"], exp_avg_sq=bufs["exp_avg_sq"], fresh=bufs.get("exp_avg_sq_fresh"),
            work=self._work, scratch=self._scratch, onebit=_Errors(bufs["worker_error"], bufs["server_error"]),
            views=self.views,
            lamb_coeff_freeze=[float(c) for c in np.asarray(saved["lamb_coeff_freeze"])],
            last_factor=[float(c) for c in np.asarray(saved["last_factor"])],
        )
        self.algorithm.t = int(saved["step"])
        compressing = self.algorithm.compression_started  # the coming step is a compressed one
        if not compressing:
            self._kept = None  # a warm-up step writes scratch, where 1-bit Adam keeps d
        kept = self._kept
        if kept is not None and np.array_equal(saved["exp_avg_sq"], kept.v):
            self.algorithm.adopt_denom(seg, kept.denom)
            seg.denom_key, seg.floor_roots, seg.floor_denoms = kept.key, list(kept.floor_roots), kept.floor_denoms
        else:  # forgotten before the step: it may write d into the kept buffer (scratch) and then raise
            kept = self._kept = None
        t = self._run_segment(seg, saved, group)
        if compressing and seg.denom_key is not None:
            v = kept.v if kept is not None else _fresh_copy(saved["exp_avg_sq"])
            self._kept = _KeptDenom(v, self.algorithm.denom_buffer(seg), seg.denom_key, list(seg.floor_roots),
                                    seg.floor_denoms)
        return {"step": np.asarray(t, dtype=np.int64),
                "lamb_coeff_freeze": _fresh_copy(np.asarray(seg.lamb_coeff_freeze, dtype=np.float64)),
                "last_factor": _fresh_copy(np.asarray(seg.last_factor, dtype=np.float64))}


@dataclasses.dataclass
class _KeptDenom:
    """The frozen denominator d of the last compressed step (``OneBitAlgorithm.frozen_denom``) and the frozen v it
    was computed from. The segment is rebuilt every step, so without this d (a square root over every element and
    the per-layer floors) would be recomputed every step. It is reused only where this step's v equals ``v``
    element for element: a restored checkpoint or a replayed warm-up gets its own d."""

    v: np.ndarray
    denom: np.ndarray
    key: tuple[float, ...]
    floor_roots: list[float]
    floor_denoms: list[float] | None


class _Errors:
    """The 1-bit error feedback of one step over fresh arrays (what ``OneBitState`` holds in the torch face)."""

    def __init__(self, worker_error: np.ndarray, server_error: np.ndarray) -> None:
        self.worker_error = worker_error
        self.server_error = server_error


class SlambStep(FusedStep):
    """SLAMB (``hvd_compress.algorithms.slamb``): m, v and the freshness c over all variables. m[~M] and v are
    this rank's own (never broadcast); c is alike on every rank (the masks are). No hooks here: the algorithm's
    one segment (one param group) runs its masked average in ``step()``, not overlapped."""

    per_rank = ("exp_avg", "exp_avg_sq")

    def __init__(self, options: SlambOptions, shapes: Sequence[tuple[int, ...]], world_size: int,
                 meter: CommMeter) -> None:
        super().__init__(None, shapes)
        # Working buffers, made once as the torch face's (state comes from the variables every step).
        self._work = BACKEND.float32_like(self.numel, None)
        self._scratch = BACKEND.float32_like(self.numel, None)
        self._mask = BACKEND.bool_like(self.numel, None)
        self.algorithm = Slamb(options, BACKEND, self._buffers(BACKEND.float32_like(self.numel, None), None, {}),
                               world_size, meter)

    def state_shapes(self) -> StateShapes:
        n = self.numel
        return {"exp_avg": ((n,), "float32", "zeros"), "exp_avg_sq": ((n,), "float32", "zeros"),
                "freshness": ((n,), "float32", "ones"), "step": ((), "int64", "zeros")}

    def _buffers(self, x: np.ndarray, g: np.ndarray | None, bufs: dict[str, np.ndarray]) -> SlambBuffers:
        def own(key: str) -> np.ndarray:
            return bufs[key] if key in bufs else BACKEND.float32_like(self.numel, None)

        return SlambBuffers(
            params=self.views(x), shapes=list(self.shapes), group_of=[0] * len(self.shapes),
            grad=own("grad") if g is None else g, exp_avg=own("exp_avg"), exp_avg_sq=own("exp_avg_sq"),
            freshness=own("freshness"), mask=self._mask, work=self._work, scratch=self._scratch,
            views=self.views,
        )

    def run(self, x: np.ndarray, g: np.ndarray, bufs: dict[str, np.ndarray], saved: dict[str, np.ndarray],
            group: dict[str, Any]) -> dict[str, np.ndarray]:
        alg = self.algorithm
        alg.buf = self._buffers(x, g, bufs)
        alg.t = int(saved["step"])
        return {"step": np.asarray(alg.step([group]), dtype=np.int64)}

    def synchronize_parameters(self, *params: np.ndarray) -> list[np.ndarray]:
        """The parameters averaged over all ranks (the algorithm's dense sync), as new arrays."""
        x = self.flatten(params)
        self.algorithm.buf = self._buffers(x, None, {})
        self.algorithm.synchronize_parameters()
        return self.views(x)


class BirderStep(FusedStep):
    """Birder's 1-bit algorithm (``hvd_compress.algorithms.birder``): this rank's shards of m, b and the error
    feedback, all per rank; the step count (with the seed, the RNG position) alike everywhere."""

    per_rank = ("m", "b", "worker_error", "server_error")

    def __init__(self, options: BirderOptions, shapes: Sequence[tuple[int, ...]], meter: CommMeter) -> None:
        super().__init__(BirderAlgorithm(options, BACKEND, [], meter), shapes)
        self.c1, self.c2 = BirderAlgorithm.state_numels(self.numel, options.hierarchical)
        self._update = BACKEND.float32_like(self.numel, None)  # the gradient's copy each step: made once

    def state_shapes(self) -> StateShapes:
        c1, c2 = self.c1, self.c2
        return {"m": ((c1,), "float32", "zeros"), "b": ((c1,), "float32", "zeros"),
                "worker_error": ((c1,), "float32", "zeros"), "server_error": ((c2,), "float32", "zeros"),
                "step": ((), "int64", "zeros")}

    def group(self, hyper: np.ndarray, flags: dict[str, Any]) -> dict[str, Any]:
        """(lr, beta, eps, weight_decay) as a param group of ``hc.Birder``."""
        lr, beta, eps, wd = (float(h) for h in np.asarray(hyper, dtype=np.float64))
        return {"lr": lr, "beta": beta, "eps": eps, "weight_decay": wd, **flags}

    def run(self, x: np.ndarray, g: np.ndarray, bufs: dict[str, np.ndarray], saved: dict[str, np.ndarray],
            group: dict[str, Any]) -> dict[str, np.ndarray]:
        seg = BirderSegment(
            group=0, params=self.views(x), sizes=list(self.sizes), grad=g,
            update=self._update, m=bufs["m"], b=bufs["b"],
            worker_error=bufs["worker_error"], server_error=bufs["server_error"], views=self.views,
        )
        t = self._run_segment(seg, saved, group)
        return {"step": np.asarray(t, dtype=np.int64)}


def make_step(op_algorithm: type, options: Any, shapes: Sequence[tuple[int, ...]], world_size: int,
              meter: CommMeter) -> FusedStep:
    """The ``FusedStep`` for an algorithm class of ``hvd_compress.algorithms.REGISTRY`` with parsed ``options``."""
    if issubclass(op_algorithm, OneBitAlgorithm):
        return OneBitStep(op_algorithm(options, BACKEND, [], meter), shapes, world_size)
    if issubclass(op_algorithm, Slamb):
        return SlambStep(options, shapes, world_size, meter)
    if issubclass(op_algorithm, BirderAlgorithm):
        return BirderStep(options, shapes, meter)
    raise NotImplementedError(f"{op_algorithm.__name__} has no TF step")


def apply_algorithm_step(runner: FusedStep, state: dict[str, Any], variables: Sequence[Any], grads: dict[int, Any],
                         hyper: Sequence[Any], flags: dict[str, Any], name: str) -> None:
    """One step of ``runner`` over ``variables`` (every one it was built for, in order) as one stateful
    ``tf.numpy_function``; ``grads`` maps ``id(variable)`` to its gradient (None: a zero gradient, decided by the
    program's structure, so alike on every rank: the fused segment always covers every variable, as the torch
    face's zeroed buffer does). ``hyper``: lr then the rule's other hyper-parameters, read at run time (schedules
    act). ``state``: the optimizer's variables named as ``runner.state_shapes()``; assigned with the results."""
    gs = float32_gradients([grads[id(v)] for v in variables], variables)
    hyper_t = tf.stack([tf.cast(h, tf.float64) for h in hyper])
    names = list(runner.state_shapes())
    state_in = [tf.convert_to_tensor(state[k]) for k in names]
    params_in = [tf.convert_to_tensor(v) for v in variables]
    n_vars, flags = len(variables), dict(flags)

    def run(hyper_a: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
        g_a, p_a, s_a = arrays[:n_vars], arrays[n_vars: 2 * n_vars], arrays[2 * n_vars:]
        return runner(flags, hyper_a, g_a, p_a, s_a)  # the algorithm's own CommMeter counts its calls

    touts = [tf.float32] * n_vars + [tf.as_dtype(state[k].dtype) for k in names]
    outs = numpy_call(run, [hyper_t, *gs, *params_in, *state_in], touts, name)
    for v, x in zip(variables, outs[:n_vars], strict=True):
        v.assign(tf.reshape(x, v.shape))
    for k, x in zip(names, outs[n_vars:], strict=True):
        if k in runner.may_be_read_only:  # empty where the step only read it
            tf.cond(tf.size(x) > 0, functools.partial(_assign, state[k], x), lambda: tf.constant(False))
        else:
            _assign(state[k], x)


def _assign(variable: Any, x: tf.Tensor) -> tf.Tensor:
    variable.assign(tf.reshape(x, variable.shape))
    return tf.constant(True)
