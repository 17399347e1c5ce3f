"""DiLoCo for the Keras wrappers (``hck.DistributedOptimizer(opt, op=hck.DiLoCo, ...)``): the inner optimizer's own
step on this rank's gradients, then the schedule of ``hvd_compress.algorithms.diloco`` in one
``tf.numpy_function(stateful=True)`` over the variables' values, with all of DiLoCo's state in the optimizer's own
variables (so that Keras checkpoints keep it).

The state variables: the step count, whether the synced copy was taken, the synced copy, the outer momentum and (with
``outer_compression``) the error feedback, all flat in fragment order; and for each sync in flight its start step + 1
(``diloco_sent_at``; 0: none) and what this rank sent (``diloco_sent``). A sync's average runs in the background
(``sync_delay``); restored into a process that did not start it, its average is made from ``diloco_sent`` at its
merge, on every rank alike, so a resume from each rank's own checkpoint is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress.algorithms import diloco
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import StateShapes
from hvd_compress.tensorflow.functions import numpy_call


class ArrayFragments:
    """``diloco.FragmentIO`` over one float32 array per variable (``members[f]``: fragment f's variables)."""

    def __init__(self, values: list[np.ndarray], members: list[list[int]]) -> None:
        self.values, self.members = values, members

    def read(self, fragment: int) -> np.ndarray:
        return np.concatenate([self.values[i].reshape(-1) for i in self.members[fragment]]).astype(np.float32)

    def write(self, fragment: int, values: np.ndarray) -> None:
        offset = 0
        for i in self.members[fragment]:
            size = self.values[i].size
            self.values[i] = values[offset : offset + size].reshape(self.values[i].shape).copy()
            offset += size


class KerasDiLoCo:
    """op=DiLoCo over the float32 variables of ``shapes`` (the order the wrapper was built with)."""

    #: State that differs between ranks by design: the error feedback, what this rank sent of a sync in flight.
    per_rank = ("diloco_error", "diloco_sent")

    def __init__(self, options: diloco.DiLoCoOptions, shapes: Sequence[tuple[int, ...]], meter: CommMeter,
                 name: str) -> None:
        if len(shapes) < options.fragments:
            raise ValueError(f"op=DiLoCo: fragments={options.fragments} but the optimizer has {len(shapes)} "
                             "trainable variable(s); every fragment needs one at least")
        self.options, self.shapes = options, [tuple(s) for s in shapes]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.members = diloco.fragment_members(len(shapes), options.fragments)
        self.fragment_sizes = [sum(sizes[i] for i in m) for m in self.members]
        self.numel = sum(sizes)
        self.sync = diloco.DiLoCoSync(options, self.fragment_sizes, ArrayFragments([], self.members), meter,
                                      f"{name}.diloco")
        #: Calls of ``run``: each copies every variable and DiLoCo's state to NumPy and back, so they happen only
        #: at the steps where a fragment's sync starts or merges (``due``).
        self.copies = 0

    def state_shapes(self) -> StateShapes:
        n, p = max(self.numel, 1), self.options.fragments
        out = {
            "diloco_step": ((), "int64", "zeros"),
            "diloco_started": ((), "int64", "zeros"),
            "diloco_synced": ((n,), "float32", "zeros"),
            "diloco_momentum": ((n,), "float32", "zeros"),
            "diloco_sent": ((n,), "float32", "zeros"),
            "diloco_sent_at": ((p,), "int64", "zeros"),
        }
        if self.options.outer_compression != "none":
            out["diloco_error"] = ((n,), "float32", "zeros")
        return out

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        bounds = np.cumsum([0, *self.fragment_sizes])
        return [np.array(flat[a:b], dtype=np.float32) for a, b in itertools.pairwise(bounds)]

    def due(self, step: tf.Tensor) -> tf.Tensor:
        """Whether a fragment's sync starts or merges after inner step ``step`` (counted from 1): the schedule of
        ``diloco.starts_sync``, and its merges ``sync_delay`` steps later, in TF, so the other steps copy nothing."""
        o, h = self.options, self.options.sync_every
        offsets = sorted({diloco.sync_offset(f, o) for f in range(o.fragments)})
        offsets = tf.constant(offsets, tf.int64)
        start = tf.reduce_any(tf.equal(step % h, offsets))
        later = step - o.sync_delay
        merge = tf.logical_and(later >= 1, tf.reduce_any(tf.equal(later % h, offsets)))
        return tf.logical_and(step >= 1, tf.logical_or(start, merge))

    def run(self, values: list[np.ndarray], saved: dict[str, np.ndarray]) -> tuple[list[np.ndarray], dict[str, Any]]:
        """After the inner step: DiLoCo's ``end_step`` on the variables' ``values`` with the state as ``saved`` in
        the variables (TF's input arrays, never written); the new values and the new state."""
        self.copies += 1
        sync, p = self.sync, self.options.fragments
        st = sync.state
        st.step = int(saved["diloco_step"])
        st.synced = self._split(saved["diloco_synced"])
        st.momentum = self._split(saved["diloco_momentum"])
        st.error = self._split(saved["diloco_error"]) if "diloco_error" in saved else None
        st.averaged = {}
        sent, sent_at = self._split(saved["diloco_sent"]), [int(x) - 1 for x in saved["diloco_sent_at"]]
        later = {}  # restored syncs whose merge is a later step's: their average is made then, kept as sent
        for f in range(p):
            live = sync.inflight.get(f)
            if live is not None and live[0] != sent_at[f]:  # a sync of a state since replaced: its call is done
                live[1].result()
                del sync.inflight[f]
                live = None
            if sent_at[f] >= 0 and live is None:  # restored: this process never made the call
                if sent_at[f] + self.options.sync_delay <= st.step + 1:
                    sync.average_now(f, sent_at[f], sent[f])
                else:
                    later[f] = (sent_at[f], sent[f])
        sync.io = ArrayFragments([np.array(v, dtype=np.float32) for v in values], self.members)
        sync.end_step()
        new_sent, new_at = [np.zeros(s, np.float32) for s in self.fragment_sizes], np.zeros(p, np.int64)
        for f, (start, _, _, copy, _) in sync.inflight.items():
            new_sent[f], new_at[f] = copy, start + 1
        for f, (start, copy) in later.items():
            new_sent[f], new_at[f] = copy, start + 1
        flat = lambda xs: np.concatenate(xs) if xs else np.zeros(1, np.float32)  # noqa: E731
        state = {
            "diloco_step": np.int64(st.step),
            "diloco_started": np.int64(1),
            "diloco_synced": flat(st.synced),
            "diloco_momentum": flat(st.momentum),
            "diloco_sent": flat(new_sent),
            "diloco_sent_at": new_at,
        }
        if st.error is not None:
            state["diloco_error"] = flat(st.error)
        return sync.io.values, state

    def step(self, grads: list[Any], variables: list[Any], built_with: Sequence[Any], state: dict[str, Any],
             apply_inner: Callable[[list[Any], list[Any]], Any], name: str) -> None:
        """The first step takes the synced copy from the variables; then the inner optimizer's step on this rank's
        gradients; then DiLoCo's schedule on every variable the wrapper was ``built_with``."""
        if sorted(id(v) for v in variables) != sorted(id(v) for v in built_with):
            raise ValueError(f"{name}: op=DiLoCo steps every variable the optimizer was built with at each step")
        order = [i for m in self.members for i in m]

        def take() -> tf.Tensor:
            flat = tf.concat([tf.reshape(tf.convert_to_tensor(built_with[i]), [-1]) for i in order], 0)
            state["diloco_synced"].assign(flat)
            state["diloco_started"].assign(1)
            return tf.constant(True)

        tf.cond(tf.equal(state["diloco_started"], 0), take, lambda: tf.constant(False))
        pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        apply_inner([g for g, _ in pairs], [v for _, v in pairs])
        step = tf.convert_to_tensor(state["diloco_step"]) + 1
        tf.cond(self.due(step), lambda: self._call(built_with, state, name),
                lambda: self._count(state["diloco_step"], step))

    @staticmethod
    def _count(variable: Any, step: tf.Tensor) -> tf.Tensor:
        """A step that neither starts nor merges a sync: only the step count moves (``run`` would change nothing
        else)."""
        variable.assign(step)
        return tf.constant(False)

    def _call(self, built_with: Sequence[Any], state: dict[str, Any], name: str) -> tf.Tensor:
        """``run`` on NumPy copies of the variables and the state, and the results assigned back."""
        keys = list(self.state_shapes())
        inputs = [tf.convert_to_tensor(v) for v in built_with] + [tf.convert_to_tensor(state[k]) for k in keys]
        touts = [tf.float32] * len(built_with) + [tf.as_dtype(state[k].dtype) for k in keys]

        def call(*arrays: np.ndarray) -> list[np.ndarray]:
            values, saved = list(arrays[: len(built_with)]), dict(zip(keys, arrays[len(built_with):], strict=True))
            new_values, new_state = self.run(values, saved)
            return [*new_values, *(np.asarray(new_state[k], dtype=saved[k].dtype) for k in keys)]

        outs = numpy_call(call, inputs, touts, f"{name}.diloco")
        for v, x in zip(built_with, outs[: len(built_with)], strict=True):
            v.assign(tf.reshape(x, v.shape))
        for k, x in zip(keys, outs[len(built_with):], strict=True):
            state[k].assign(tf.reshape(x, state[k].shape))
        return tf.constant(True)
