"""One step of an algorithm of ``hvd_compress.algorithms`` (1-bit Adam, 1-bit LAMB, SLAMB, Birder) on NumPy copies
of a TF face's variables: the run-time half of ``hvd_compress.keras.DistributedOptimizer``.

The state lives in framework variables (so checkpoints keep it). The variables are cut into buckets as the torch
face cuts its parameters (``plan_bucket_ranges``), the algorithm's state per bucket, and each step is a
chain of stateful ``tf.numpy_function`` ops, as ``hvd_compress.tensorflow.bucketed`` does for Average/Sum: a start
op per bucket, fed by that bucket's gradients only (so TF runs it while it still computes earlier layers'
gradients), which reports its bucket final (``BucketedAlgorithm.gradient_final``); the first also makes the
step's ``_Session`` of fresh 64-byte aligned copies (TF's inputs alias its buffers and are never written) over
which ``bind`` lays the buckets. One finish op runs the algorithm's step and returns the new parameters and
state. ``overlap=False`` gates every start op on every gradient: the same calls, bit-identical results. A buffer
the step only reads (``read_only``) is not copied, and an empty array goes back for it. A per-bucket state of
another cut (``LAYOUT``) is refused. Every step-dependent decision is made at run time. The subclasses below only
say which buffers each algorithm keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress.algorithms.birder import BirderAlgorithm, BirderBucket, BirderOptions
from hvd_compress.algorithms.contract import Wraps
from hvd_compress.algorithms.onebit import OneBitAlgorithm, OneBitBucket
from hvd_compress.algorithms.slamb import Slamb, SlambBucket, SlambBuffers, SlambOptions
from hvd_compress.algorithms.zero_one_adam import ZeroOneAdam, ZeroOneBucket
from hvd_compress.ops import runtime
from hvd_compress.ops.buckets import DEFAULT_BUCKET_MB, cut_buckets
from hvd_compress.ops.collectives import reject_allreduce
from hvd_compress.ops.onebit import server_error_numel
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.backend import BACKEND, aligned_empty
from hvd_compress.tensorflow.functions import dense, numpy_call

StateShapes = dict[str, tuple[tuple[int, ...], str, str]]  # name -> (shape, dtype, Keras initializer)
#: The state entry of a runner cut into several buckets with per-bucket state (Birder): each bucket's elements, so
#: that a checkpoint of another cut is refused (another count of buckets: another shape, which Keras refuses).
LAYOUT = "buckets"
#: The state entry of a runner with variables excluded from weight decay (``no_decay``): per variable in the
#: runner's order, its index in the optimizer's variable list + 1, negated where excluded. Those variables come
#: first, so the flat state's order depends on the exclusions: a checkpoint of other exclusions is refused.
DECAY_ORDER = "weight_decay_order"


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


def plan_bucket_ranges(sizes: Sequence[int], bucket_mb: float, groups: Sequence[int] | None = None) -> tuple[
        list[tuple[int, int]], list[int]]:
    """The buckets of float32 variables of ``sizes`` elements as the torch face cuts its param groups
    (``ops.buckets.cut_buckets``; ``groups``: each variable's group, the groups' variables consecutive, or one
    group): each bucket's variable range [lo, hi) in variable order, and the bucket indices in bucket order."""
    groups = groups or [0] * len(sizes)
    buckets, order = cut_buckets([((g, "float32"), 4 * n) for g, n in zip(groups, sizes, strict=True)], bucket_mb)
    return [(members[0], members[-1] + 1) for members in buckets], order


@dataclasses.dataclass
class _Session:
    """One step between its first start op and its finish op: the fresh arrays the algorithm is bound over."""

    x: np.ndarray
    g: np.ndarray
    bufs: dict[str, np.ndarray]
    saved: dict[str, np.ndarray]  # the ``scalars`` state (copies: TF's input arrays are not kept past the op)
    groups: list[dict[str, Any]]  # the param groups the algorithm reads (``FusedStep.param_groups``)
    read_only: frozenset[str]  # state the step only reads: bound at the finish op, from its own inputs


class FusedStep(FlatLayout):
    """All trainable variables (``shapes``, in order) as flat float32 buffers cut into buckets (``ranges``: each
    bucket's variables, in variable order; ``order``: the bucket order; ``plan_bucket_ranges``), and the algorithm
    that steps them. Subclasses name the state buffers (``state_shapes``), the ones that
    differ between ranks by design (``per_rank``), bind the algorithm's buckets over a step's arrays (``bind``)
    and step it (``finish_state``).

    ``no_decay``: the first that many variables are excluded from weight decay (Keras's
    ``exclude_from_weight_decay``): they form the first param group, with weight_decay 0, and the others the
    second, as the torch face's param groups [no decay, decay] (buckets never mix groups); ``origin``: each
    variable's index in the optimizer's own list (recorded in ``DECAY_ORDER``)."""

    #: State names that are scalars or small lists, not flat buffers copied as such.
    scalars: tuple[str, ...] = ("step", LAYOUT, DECAY_ORDER)
    per_rank: tuple[str, ...] = ()
    #: State buffers that some steps only read (``read_only``): not copied in, and not assigned back then.
    may_be_read_only: tuple[str, ...] = ()
    #: The kind the algorithm wraps: how the face's hyper-parameters become its param group (``make_step`` sets it).
    wraps: Wraps

    def __init__(self, algorithm: Any, shapes: Sequence[tuple[int, ...]], bucket_mb: float, no_decay: int = 0,
                 origin: Sequence[int] | None = None) -> None:
        super().__init__(shapes)
        self.no_decay = no_decay
        self.group_of = [1 if 0 < no_decay <= i else 0 for i in range(len(self.sizes))]  # [no decay, decay] or one
        origin = list(range(len(self.sizes))) if origin is None else list(origin)
        self.decay_order = np.asarray([-(o + 1) if i < no_decay else o + 1 for i, o in enumerate(origin)], np.int64)
        self.ranges, self.order = plan_bucket_ranges(self.sizes, bucket_mb, self.group_of)
        self.bucket_groups = [self.group_of[lo] for lo, _ in self.ranges]
        self.layouts = [FlatLayout(self.shapes[lo:hi]) for lo, hi in self.ranges]
        self._sessions: dict[int, _Session] = {}
        self._tokens = itertools.count()
        self.algorithm = algorithm
        if algorithm is not None:
            self._attach(algorithm)

    def rank_bound_moments(self) -> tuple[str, ...]:
        """State keys beside the error feedback that another rank's values are wrong for (a reset zeroes them)."""
        return ()

    def _attach(self, algorithm: Any) -> None:
        algorithm.order = self.order
        algorithm.keep_backups = False  # a failed step's fresh copies are dropped, never assigned to the variables

    def state_shapes(self) -> StateShapes:
        raise NotImplementedError

    def layout_shape(self) -> StateShapes:
        """``order_shape``'s entry, then ``LAYOUT``'s where the state is per bucket and there is more than one (with
        one bucket the state needs no layout, so checkpoints without the entry still load). In that order: Keras 3
        restores an optimizer's variables by position, and the entry always there stays in place."""
        layout: StateShapes = {LAYOUT: ((len(self.ranges),), "int64", "zeros")} if len(self.ranges) > 1 else {}
        return {**self.order_shape(), **layout}

    def order_shape(self) -> StateShapes:
        """``DECAY_ORDER``'s entry, with or without exclusions from weight decay: a state restored into an
        optimizer that excludes other variables, or none, is in another variable order even with one bucket,
        and only the entry on the restoring side can tell."""
        return {DECAY_ORDER: ((len(self.sizes),), "int64", "zeros")}

    def param_groups(self, hyper: np.ndarray, flags: dict[str, Any]) -> list[dict[str, Any]]:
        """(lr, *the wrapped kind's hyper-parameters) as the param groups the algorithm reads (``Wraps.group``):
        one, or with ``no_decay`` the excluded variables' (weight_decay 0) and the others'."""
        group = self.wraps.group(np.asarray(hyper, dtype=np.float64), flags)
        return [{**group, "weight_decay": 0.0}, group] if self.no_decay else [group]

    def read_only(self, saved: dict[str, np.ndarray]) -> frozenset[str]:
        """The names of ``may_be_read_only`` that the coming step (state ``saved``) does not write."""
        return frozenset()

    def bind(self, session: _Session) -> None:
        """Bind the algorithm's buckets over ``session``'s arrays for the coming step (the ``read_only`` state
        comes at the finish op)."""
        raise NotImplementedError

    def finish_state(self, session: _Session) -> dict[str, np.ndarray]:
        """Step the bound algorithm (every bucket started); returns the new values of the ``scalars`` state."""
        raise NotImplementedError

    def span(self, bucket: int) -> tuple[int, int]:
        """The elements [a, b) of the flat buffers that bucket ``bucket`` (in variable order) covers."""
        lo, hi = self.ranges[bucket]
        return self.cuts[lo][0], self.cuts[hi - 1][1]

    def bucket_numels(self) -> list[int]:
        """The elements of each bucket, in variable order (what ``LAYOUT`` records)."""
        return [sum(self.sizes[lo:hi]) for lo, hi in self.ranges]

    def bucket_members(self) -> list[list[int]]:
        """The variable indices of each bucket, in bucket order."""
        return [list(range(*self.ranges[b])) for b in self.order]

    # -- the step: start ops, then the finish op ----------------------------------------------------------
    def start(self, position: int, flags: dict[str, Any]) -> Callable[..., np.ndarray]:
        """The start op of the ``position``-th bucket in bucket order. Its arrays: (hyper, parameters, state) for
        the first, else the previous start op's token; then the bucket's gradients. Returns the session's token."""
        bucket = self.order[position]
        lo, hi = self.ranges[bucket]
        n_vars, n_state = len(self.sizes), len(self.state_shapes())

        def run(*arrays: np.ndarray) -> np.ndarray:
            alg = self.algorithm
            try:
                if position == 0:
                    if self._sessions:  # a step whose finish op never ran (its graph failed): drop it
                        alg.abandon()
                        self._sessions.clear()
                    hyper, rest = arrays[0], arrays[1:]
                    session = self._session(rest[:n_vars], rest[n_vars: n_vars + n_state],
                                            self.param_groups(hyper, flags))
                    token = next(self._tokens)
                    self._sessions[token] = session
                    self.bind(session)
                    grads = rest[n_vars + n_state:]
                else:
                    token, grads = int(arrays[0]), arrays[1:]
                    session = self._sessions[token]
                for (a, b), grad in zip(self.cuts[lo:hi], grads, strict=True):
                    session.g[a:b] = np.asarray(grad).reshape(-1)
            except Exception as e:  # this rank's alone: each bucket still to come joins its call as a rejection
                for later in self.order[position:]:
                    runtime.submit(reject_allreduce, f"{type(e).__name__}: {e}",
                                   f"{alg.name}.bucket.{later}").exception()
                raise
            alg.gradient_final(bucket, session.groups, count=hi - lo)
            return np.array(token, np.int64)

        return run

    def finish(self, token: np.ndarray, *late: np.ndarray) -> list[np.ndarray]:
        """The finish op: the step (waiting for every bucket). ``late``: the ``may_be_read_only`` state as TF
        passes it now. Returns the new parameters (flat per variable) then the new state, in ``state_shapes``
        order; a state buffer this step only read comes back empty (``apply_algorithm_step`` then leaves its
        variable)."""
        session = self._sessions.pop(int(token))
        only_read = {}  # what goes back for a buffer the step only read: nothing, the variable is left as it is
        for k, array in zip(self.may_be_read_only, late, strict=True):
            if k in session.read_only:
                session.bufs[k] = _read_only_view(array)
                only_read[k] = np.empty(0, array.dtype)
        new = self.finish_state(session)
        if LAYOUT in session.saved:
            new[LAYOUT] = np.asarray(self.bucket_numels(), dtype=np.int64)
        new[DECAY_ORDER] = self.decay_order.copy()
        new_state = {**session.bufs, **new, **only_read}
        return [*self.views(session.x), *(new_state[k] for k in self.state_shapes())]

    def _session(self, params: Sequence[np.ndarray], state: Sequence[np.ndarray],
                 groups: list[dict[str, Any]]) -> _Session:
        """A session over fresh copies of ``params`` and ``state`` (``state_shapes`` order); ValueError where the
        state was written with other exclusions from weight decay or another cut."""
        names = list(self.state_shapes())
        given = dict(zip(names, state, strict=True))
        step = int(given["step"])
        self._check_decay_order(np.asarray(given[DECAY_ORDER]), step)  # first: other exclusions cut other buckets
        if LAYOUT in given:
            self._check_layout(np.asarray(given[LAYOUT]), step)
        read_only = self.read_only(given)
        bufs = {k: _fresh_copy(given[k]) for k in names if k not in self.scalars and k not in read_only}
        saved = {k: np.array(given[k]) for k in names if k in self.scalars}
        return _Session(x=self.flatten(params), g=aligned_empty(self.numel, np.float32), bufs=bufs, saved=saved,
                        groups=groups, read_only=read_only)

    def _check_layout(self, saved: np.ndarray, step: int) -> None:
        """ValueError unless the state's bucket layout ``saved`` is this runner's; at step 0 (a fresh state: the
        variable starts at zeros and each step writes it) any. A checkpoint without the layout variable restored into
        these by name (``tf.train.Checkpoint``) leaves it at zeros past step 0: refused too, as its cut is unknown."""
        mine = np.asarray(self.bucket_numels(), dtype=np.int64)
        if step == 0 or np.array_equal(saved, mine):
            return
        if saved.shape == mine.shape and not saved.any():
            raise ValueError(
                f"{self.algorithm.name}: the optimizer state (step {step}) records no bucket cut, this optimizer cuts "
                f"{mine.tolist()}: a checkpoint written before the TF faces cut buckets? Its per-bucket state cannot "
                "be carried over"
            )
        raise ValueError(
            f"{self.algorithm.name}: the optimizer state holds buckets of {saved.tolist()} elements, this optimizer "
            f"cuts {mine.tolist()} (another model, bucket_mb or variables excluded from weight decay): per-bucket "
            "state cannot be carried over"
        )

    def _check_decay_order(self, saved: np.ndarray, step: int) -> None:
        """ValueError unless the state was written with this runner's exclusions from weight decay (at step 0, a
        fresh state, any): the flat state follows the variables' order, which the exclusions set. Zeros past step 0
        are a checkpoint without the entry, in the variables' own order: taken where this runner excludes none."""
        if step == 0 or np.array_equal(saved, self.decay_order):
            return
        if not self.no_decay and saved.shape == self.decay_order.shape and not saved.any():
            return
        raise ValueError(
            f"{self.algorithm.name}: the optimizer state (step {step}) was written with other variables excluded "
            "from weight decay (exclude_from_weight_decay), or with none: its flat state is in another variable "
            "order and cannot be carried over; exclude the same variables as when it was saved"
        )

    def _step(self, session: _Session) -> int:
        """The bound algorithm's step; its buckets are dropped after (the arrays then belong to TF)."""
        try:
            return self.algorithm.step(session.groups)
        finally:
            self.algorithm.buckets = []


class OneBitStep(FusedStep):
    """1-bit Adam / 1-bit LAMB (``hvd_compress.algorithms.onebit``): moments, error feedback (per bucket: each
    bucket's worker error and server chunk, or with ``hierarchical`` its hierarchical pair), LAMB's per-layer
    frozen coefficients. With more than one bucket the state records the cut (``LAYOUT``)."""

    scalars = ("step", "lamb_coeff_freeze", "last_factor", LAYOUT, DECAY_ORDER)
    per_rank = ("worker_error", "server_error")
    # v is frozen in the compression stage (both papers' Alg. 1): read there, never written.
    may_be_read_only = ("exp_avg_sq",)

    def __init__(self, algorithm: OneBitAlgorithm, shapes: Sequence[tuple[int, ...]], world_size: int,
                 bucket_mb: float = DEFAULT_BUCKET_MB, **decay: Any) -> None:
        super().__init__(algorithm, shapes, bucket_mb, **decay)
        self.world_size = world_size
        self._kept: _KeptDenom | None = None
        # Working buffers, every element written before it is read in a step: made once, not per step.
        self._work = BACKEND.float32_like(self.numel, None)
        self._scratch = BACKEND.float32_like(self.numel, None)
        # Each bucket's (worker, server) error feedback, as its compressed allreduce uses it.
        errors = [algorithm.error_numels(n, world_size) for n in self.bucket_numels()]
        self._error_cuts = [list(itertools.accumulate((0, *(e[k] for e in errors)))) for k in (0, 1)]

    def state_shapes(self) -> StateShapes:
        n, layers = self.numel, len(self.sizes)
        shapes = {"exp_avg": ((n,), "float32", "zeros"), "exp_avg_sq": ((n,), "float32", "zeros")}
        if self.algorithm.has_fresh_variance:
            shapes["exp_avg_sq_fresh"] = ((n,), "float32", "zeros")
        shapes.update(
            worker_error=((self._error_cuts[0][-1],), "float32", "zeros"),
            server_error=((self._error_cuts[1][-1],), "float32", "zeros"),
            step=((), "int64", "zeros"),
            lamb_coeff_freeze=((layers,), "float64", "zeros"),
            last_factor=((layers,), "float64", "ones"),
        )
        return {**shapes, **self.layout_shape()}

    def read_only(self, saved: dict[str, np.ndarray]) -> frozenset[str]:
        self.algorithm.t = int(saved["step"])
        return frozenset(self.may_be_read_only) if self.algorithm.compression_started else frozenset()

    def bind(self, session: _Session) -> None:
        alg, bufs, (w, s) = self.algorithm, session.bufs, self._error_cuts
        alg.t = int(session.saved["step"])
        coeff = np.asarray(session.saved["lamb_coeff_freeze"], dtype=np.float64)
        last = np.asarray(session.saved["last_factor"], dtype=np.float64)
        fresh = bufs.get("exp_avg_sq_fresh")
        buckets = []
        for i, ((lo, hi), layout) in enumerate(zip(self.ranges, self.layouts, strict=True)):
            a, b = self.span(i)
            errors = (bufs["worker_error"][w[i]:w[i + 1]], bufs["server_error"][s[i]:s[i + 1]])
            seg = OneBitBucket(
                group=self.bucket_groups[i], params=layout.views(session.x[a:b]), sizes=list(layout.sizes),
                grad=session.g[a:b],
                exp_avg=bufs["exp_avg"][a:b],
                exp_avg_sq=bufs["exp_avg_sq"][a:b] if "exp_avg_sq" in bufs else None,  # read-only: at finish
                fresh=None if fresh is None else fresh[a:b], work=self._work[a:b], scratch=self._scratch[a:b],
                onebit=_Errors(*errors), views=layout.views,
                lamb_coeff_freeze=[float(c) for c in coeff[lo:hi]], last_factor=[float(c) for c in last[lo:hi]],
            )
            if alg.options.hierarchical:
                seg.hierarchical_errors = errors
            buckets.append(seg)
        alg.buckets = buckets

    def finish_state(self, session: _Session) -> dict[str, np.ndarray]:
        alg, buckets = self.algorithm, list(self.algorithm.buckets)
        v = session.bufs["exp_avg_sq"]
        for i, seg in enumerate(buckets):
            a, b = self.span(i)
            seg.exp_avg_sq = v[a:b]
        compressing = bool(session.read_only)  # the coming step is a compressed one: v is frozen
        if not compressing:
            self._kept = None  # a warm-up step writes scratch, where 1-bit Adam keeps d
        kept = self._kept
        if kept is not None and np.array_equal(v, kept.v):
            for seg, denom, key, roots, floors in zip(buckets, kept.denoms, kept.keys, kept.floor_roots,
                                                      kept.floor_denoms, strict=True):
                alg.adopt_denom(seg, denom)
                seg.denom_key, seg.floor_roots, seg.floor_denoms = key, list(roots), floors
        else:  # forgotten before the step: it may write d into the kept buffer (scratch) and then raise
            kept = self._kept = None
        t = self._step(session)
        if compressing and all(seg.denom_key is not None for seg in buckets):
            self._kept = _KeptDenom(kept.v if kept is not None else _fresh_copy(v),
                                    [alg.denom_buffer(seg) for seg in buckets], [seg.denom_key for seg in buckets],
                                    [list(seg.floor_roots) for seg in buckets],
                                    [seg.floor_denoms for seg in buckets])
        return {"step": np.asarray(t, dtype=np.int64),
                "lamb_coeff_freeze": _fresh_copy(np.asarray([c for seg in buckets for c in seg.lamb_coeff_freeze],
                                                            dtype=np.float64)),
                "last_factor": _fresh_copy(np.asarray([c for seg in buckets for c in seg.last_factor],
                                                      dtype=np.float64))}


@dataclasses.dataclass
class _KeptDenom:
    """The frozen denominator d of the last compressed step (``OneBitAlgorithm.frozen_denom``), per bucket, and the
    frozen v it was computed from. The buckets are rebuilt every step, so without this d (a square root over every
    element and the per-layer floors) would be recomputed every step. It is reused only where this step's v equals
    ``v`` element for element: a restored checkpoint or a replayed warm-up gets its own d."""

    v: np.ndarray
    denoms: list[np.ndarray]
    keys: list[tuple[float, ...]]
    floor_roots: list[list[float]]
    floor_denoms: list[list[float] | None]


class _Errors:
    """The 1-bit error feedback of one step over fresh arrays (what ``OneBitState`` holds in the torch face)."""

    def __init__(self, worker_error: np.ndarray, server_error: np.ndarray) -> None:
        self.worker_error = worker_error
        self.server_error = server_error

    def reset(self) -> None:
        self.worker_error[:] = 0
        self.server_error[:] = 0


class ZeroOneStep(FusedStep):
    """0/1 Adam (``hvd_compress.algorithms.zero_one_adam``): m and v, u and x_anchor over all variables; each bucket's
    error feedback and sum of lr since the last sync; the step and the four schedule counters. m, u and the errors
    are per rank (after the freeze the ranks step on their own gradients between syncs). A change made to the
    variables between two of its steps (the step count as it left it, the values not) is the algorithm's
    ``parameters_edited`` (spec Z20): ``_written`` holds what the last step left."""

    scalars = ("step", "counters", "lrs", LAYOUT, DECAY_ORDER, "error_lr")
    per_rank = ("exp_avg", "u", "worker_error", "server_error")
    FRESH_COUNTERS = (1, 0, 1, 0)  # var_interval, var_counter, local_step_interval, local_step_counter at step 0

    def __init__(self, algorithm: ZeroOneAdam, shapes: Sequence[tuple[int, ...]], world_size: int,
                 bucket_mb: float = DEFAULT_BUCKET_MB, **decay: Any) -> None:
        super().__init__(algorithm, shapes, bucket_mb, **decay)
        # Working buffers, every element written before it is read in a step: made once, not per step.
        self._work, self._scratch, self._denom = (BACKEND.float32_like(self.numel, None) for _ in range(3))
        errors = [(n, server_error_numel(n, world_size)) for n in self.bucket_numels()]
        self._error_cuts = [list(itertools.accumulate((0, *(e[k] for e in errors)))) for k in (0, 1)]
        algorithm.detects_edits = True
        self._written: tuple[int, np.ndarray] | None = None  # (step, flat variables) after the last step or sync

    def state_shapes(self) -> StateShapes:
        n, buckets = self.numel, len(self.ranges)
        return {"exp_avg": ((n,), "float32", "zeros"), "exp_avg_sq": ((n,), "float32", "zeros"),
                "u": ((n,), "float32", "zeros"), "anchor": ((n,), "float32", "zeros"),
                "worker_error": ((self._error_cuts[0][-1],), "float32", "zeros"),
                "server_error": ((self._error_cuts[1][-1],), "float32", "zeros"),
                "step": ((), "int64", "zeros"), "counters": ((4,), "int64", "zeros"),
                "lrs": ((buckets,), "float64", "zeros"), **self.layout_shape(),
                "error_lr": ((buckets,), "float64", "zeros")}  # last: the variables before keep their positions

    def bind(self, session: _Session) -> None:
        alg, bufs, saved, (w, s) = self.algorithm, session.bufs, session.saved, self._error_cuts
        t = int(saved["step"])
        written = self._written  # only phase 2 compares and keeps a copy: phase 1 steps x in place
        alg.parameters_edited = written is not None and written[0] == t and not np.array_equal(written[1], session.x)
        alg.restore_schedule(t, self.FRESH_COUNTERS if t == 0 else saved["counters"])
        lrs = np.asarray(saved["lrs"], dtype=np.float64)
        error_lr = np.asarray(saved["error_lr"], dtype=np.float64)
        buckets = []
        for i, layout in enumerate(self.layouts):
            a, b = self.span(i)
            buckets.append(ZeroOneBucket(
                group=self.bucket_groups[i], params=layout.views(session.x[a:b]), sizes=list(layout.sizes),
                grad=session.g[a:b],
                exp_avg=bufs["exp_avg"][a:b], exp_avg_sq=bufs["exp_avg_sq"][a:b], u=bufs["u"][a:b],
                anchor=bufs["anchor"][a:b], work=self._work[a:b], scratch=self._scratch[a:b],
                denom=self._denom[a:b], onebit=_Errors(bufs["worker_error"][w[i]:w[i + 1]],
                                                       bufs["server_error"][s[i]:s[i + 1]]),
                views=layout.views, lrs=float(lrs[i]), error_lr=float(error_lr[i]),
            ))
        alg.buckets = buckets

    def finish_state(self, session: _Session) -> dict[str, np.ndarray]:
        alg, buckets = self.algorithm, list(self.algorithm.buckets)
        t = self._step(session)
        self._written = (t, session.x.copy()) if t >= alg.options.var_freeze_step else None
        counters = [alg.var_interval, alg.var_counter, alg.local_step_interval, alg.local_step_counter]
        return {"step": np.asarray(t, dtype=np.int64), "counters": _fresh_copy(np.asarray(counters, np.int64)),
                "lrs": _fresh_copy(np.asarray([seg.lrs for seg in buckets], dtype=np.float64)),
                "error_lr": _fresh_copy(np.asarray([seg.error_lr for seg in buckets], dtype=np.float64))}

    def synchronize_parameters(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """``ZeroOneAdam.synchronize_parameters`` (spec Z20: the dense average that ends the local interval) over
        the parameters then the state in ``state_shapes`` order; returns them in the same order, as new arrays."""
        n_vars = len(self.sizes)
        session = self._session(arrays[:n_vars], arrays[n_vars:], [])
        self.bind(session)
        try:
            self.algorithm.synchronize_parameters()
            lrs = np.asarray([seg.lrs for seg in self.algorithm.buckets], dtype=np.float64)
        finally:
            self.algorithm.buckets = []
        new = {**session.bufs, **session.saved, "lrs": lrs}
        t = int(session.saved["step"])
        self._written = (t, session.x.copy()) if t >= self.algorithm.options.var_freeze_step else None
        return [*self.views(session.x), *(new[k] for k in self.state_shapes())]


class SlambStep(FusedStep):
    """SLAMB (``hvd_compress.algorithms.slamb``): m, v and the freshness c over all variables. m[~M] and v are
    this rank's own (never broadcast); c is alike on every rank (the masks are). Each bucket's momentum and masked
    average (the algorithm's steps 3 and 4) start from its start op; the state is element-wise over all variables,
    so it does not depend on the cut (no ``LAYOUT``)."""

    per_rank = ("exp_avg", "exp_avg_sq")

    def __init__(self, options: SlambOptions, shapes: Sequence[tuple[int, ...]], world_size: int,
                 meter: CommMeter, bucket_mb: float = DEFAULT_BUCKET_MB, algorithm: type = Slamb, **decay: Any) -> None:
        super().__init__(None, shapes, bucket_mb, **decay)
        # Working buffers, made once as the torch face's (state comes from the variables every step).
        self._work = BACKEND.float32_like(self.numel, None)
        self._scratch = BACKEND.float32_like(self.numel, None)
        self._mask = BACKEND.bool_like(self.numel, None)
        # ``params`` only count the members (the algorithm reads the flat buffers).
        buckets = [SlambBucket(group=self.bucket_groups[i], first=self.span(i)[0], sizes=self.sizes[lo:hi],
                               params=list(range(lo, hi))) for i, (lo, hi) in enumerate(self.ranges)]
        self.algorithm = algorithm(options, BACKEND, buckets, meter, world_size=world_size,
                                   buffers=self._buffers(BACKEND.float32_like(self.numel, None), None, {}))
        self._attach(self.algorithm)

    def state_shapes(self) -> StateShapes:
        n = self.numel
        return {"exp_avg": ((n,), "float32", "zeros"), "exp_avg_sq": ((n,), "float32", "zeros"),
                "freshness": ((n,), "float32", "ones"), "step": ((), "int64", "zeros"), **self.order_shape()}

    def _buffers(self, x: np.ndarray, g: np.ndarray | None, bufs: dict[str, np.ndarray]) -> SlambBuffers:
        def own(key: str) -> np.ndarray:
            return bufs[key] if key in bufs else BACKEND.float32_like(self.numel, None)

        return SlambBuffers(
            params=self.views(x), shapes=list(self.shapes), group_of=list(self.group_of),
            grad=own("grad") if g is None else g, exp_avg=own("exp_avg"), exp_avg_sq=own("exp_avg_sq"),
            freshness=own("freshness"), mask=self._mask, work=self._work, scratch=self._scratch,
            views=self.views,
        )

    def bind(self, session: _Session) -> None:
        self.algorithm.buf = self._buffers(session.x, session.g, session.bufs)
        self.algorithm.t = int(session.saved["step"])

    def finish_state(self, session: _Session) -> dict[str, np.ndarray]:
        return {"step": np.asarray(self.algorithm.step(session.groups), dtype=np.int64)}  # its buffers: rebound

    def synchronize_parameters(self, *params: np.ndarray) -> list[np.ndarray]:
        """The parameters averaged over all ranks (the algorithm's dense sync), as new arrays."""
        x = self.flatten(params)
        self.algorithm.buf = self._buffers(x, None, {})
        self.algorithm.synchronize_parameters()
        return self.views(x)


class BirderStep(FusedStep):
    """Birder's 1-bit algorithm (``hvd_compress.algorithms.birder``): this rank's shards of m, b and the error
    feedback, all per rank and per bucket (each bucket its own); the step count (with the seed, the RNG position)
    alike everywhere. With more than one bucket the state records the cut (``LAYOUT``). The algorithm's
    ``bucket_scalars`` (SignSGD's ``error_lr``) are float64 variables of a value per bucket, after the others."""

    per_rank = ("m", "b", "worker_error", "server_error")

    def __init__(self, options: BirderOptions, shapes: Sequence[tuple[int, ...]], meter: CommMeter,
                 bucket_mb: float = DEFAULT_BUCKET_MB, algorithm: type = BirderAlgorithm, **decay: Any) -> None:
        super().__init__(algorithm(options, BACKEND, [], meter), shapes, bucket_mb, **decay)
        numels = [algorithm.state_numels(n, options.hierarchical) for n in self.bucket_numels()]
        self._state_cuts = [list(itertools.accumulate((0, *(c[k] for c in numels)))) for k in (0, 1)]
        self._update = BACKEND.float32_like(self.numel, None)  # the gradient's copy each step: made once
        self.bucket_scalars: tuple[str, ...] = tuple(algorithm.bucket_scalars)
        self.scalars = (*FusedStep.scalars, *self.bucket_scalars)

    def rank_bound_moments(self) -> tuple[str, ...]:
        """m and b where they are this rank's chunk's only (``BirderAlgorithm.sharded_moments``): another rank's
        are other elements' moments."""
        return ("m", "b") if self.algorithm.sharded_moments() else ()

    def state_shapes(self) -> StateShapes:
        c1, c2 = self._state_cuts[0][-1], self._state_cuts[1][-1]
        return {"m": ((c1,), "float32", "zeros"), "b": ((c1,), "float32", "zeros"),
                "worker_error": ((c1,), "float32", "zeros"), "server_error": ((c2,), "float32", "zeros"),
                "step": ((), "int64", "zeros"), **self.layout_shape(),
                **{k: ((len(self.ranges),), "float64", "zeros") for k in self.bucket_scalars}}

    def bind(self, session: _Session) -> None:
        (c1, c2), bufs, buckets = self._state_cuts, session.bufs, []
        scalars = {k: np.asarray(session.saved[k], dtype=np.float64) for k in self.bucket_scalars}
        for i, layout in enumerate(self.layouts):
            a, b = self.span(i)
            buckets.append(BirderBucket(
                group=self.bucket_groups[i], params=layout.views(session.x[a:b]), sizes=list(layout.sizes),
                grad=session.g[a:b],
                update=self._update[a:b], m=bufs["m"][c1[i]:c1[i + 1]], b=bufs["b"][c1[i]:c1[i + 1]],
                worker_error=bufs["worker_error"][c1[i]:c1[i + 1]],
                server_error=bufs["server_error"][c2[i]:c2[i + 1]], views=layout.views,
                **{k: float(v[i]) for k, v in scalars.items()},
            ))
        self.algorithm.buckets = buckets
        self.algorithm.t = int(session.saved["step"])

    def finish_state(self, session: _Session) -> dict[str, np.ndarray]:
        buckets = self.algorithm.buckets
        new = {"step": np.asarray(self._step(session), dtype=np.int64)}
        for k in self.bucket_scalars:
            new[k] = _fresh_copy(np.asarray([getattr(seg, k) for seg in buckets], dtype=np.float64))
        return new


def make_step(op_algorithm: type, options: Any, shapes: Sequence[tuple[int, ...]], world_size: int,
              meter: CommMeter, bucket_mb: float = DEFAULT_BUCKET_MB, no_decay: int = 0,
              origin: Sequence[int] | None = None) -> FusedStep:
    """The ``FusedStep`` of the buffers an algorithm class of ``hvd_compress.algorithms.REGISTRY`` declares, with
    parsed ``options``, cut into buckets of ``bucket_mb`` MiB; ``no_decay``, ``origin``: as ``FusedStep``'s."""
    step: FusedStep
    decay = {"no_decay": no_decay, "origin": origin}
    if op_algorithm.buffers == "onebit":
        step = OneBitStep(op_algorithm(options, BACKEND, [], meter), shapes, world_size, bucket_mb, **decay)
    elif op_algorithm.buffers == "slamb":
        step = SlambStep(options, shapes, world_size, meter, bucket_mb, op_algorithm, **decay)
    elif op_algorithm.buffers == "flat":
        step = BirderStep(options, shapes, meter, bucket_mb, op_algorithm, **decay)
    elif op_algorithm.buffers == "zeroone":
        step = ZeroOneStep(op_algorithm(options, BACKEND, [], meter), shapes, world_size, bucket_mb, **decay)
    else:
        raise NotImplementedError(f"{op_algorithm.__name__}: no TF step for buffers {op_algorithm.buffers!r}")
    step.wraps = op_algorithm.wraps
    return step


def apply_algorithm_step(runner: FusedStep, state: dict[str, Any], variables: Sequence[Any], grads: dict[int, Any],
                         hyper: Sequence[Any], flags: dict[str, Any], name: str, overlap: bool = True) -> None:
    """One step of ``runner`` over ``variables`` (every one it was built for, in order): a stateful
    ``tf.numpy_function`` start op per bucket, then one finish op (module docstring); ``overlap=False`` gates the
    start ops on every gradient. ``grads`` maps ``id(variable)`` to its gradient (None: a zero gradient, decided by
    the program's structure, so alike on every rank: the buckets always cover every variable, as the torch face's
    zeroed buffer does). ``hyper``: lr then the rule's other hyper-parameters, read at run time (schedules act).
    ``state``: the optimizer's variables named as ``runner.state_shapes()``; assigned with the results."""
    gs = float32_gradients([grads[id(v)] for v in variables], variables)
    hyper_t = tf.stack([tf.cast(h, tf.float64) for h in hyper])
    names = list(runner.state_shapes())
    state_in = [tf.convert_to_tensor(state[k]) for k in names]
    params_in = [tf.convert_to_tensor(v) for v in variables]
    n_vars, flags = len(variables), dict(flags)
    touts = [tf.float32] * n_vars + [tf.as_dtype(state[k].dtype) for k in names]
    token = None
    with tf.control_dependencies([] if overlap else gs):  # overlap=False: every bucket waits for every gradient
        for position, members in enumerate(runner.bucket_members()):
            own = [gs[i] for i in members]
            inputs = [hyper_t, *params_in, *state_in, *own] if position == 0 else [token, *own]
            token = numpy_call(runner.start(position, flags), inputs, [tf.int64], f"{name}.b{position}")[0]
    late = [state_in[names.index(k)] for k in runner.may_be_read_only]  # the algorithm's own CommMeter counts
    outs = numpy_call(runner.finish, [token, *late], touts, name)
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
