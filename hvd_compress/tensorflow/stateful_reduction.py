"""A gradient reduction of the Keras wrappers that keeps state between steps in the wrapper's own variables, so
that Keras checkpoints keep it: top-k/random-k's error feedback (``tensorflow.error_feedback``) and PowerSGD's
error and factors (``tensorflow.powersgd``).

Each step is one ``tf.numpy_function(stateful=True)`` after backward over the gradients of every variable, on fresh
copies of the state: a call that any rank rejects raises on every rank before any variable is assigned. A subclass
says which state it keeps (``state_shapes``) and what one call does on the NumPy arrays (``run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_compress.ops.errors import MismatchError
from hvd_compress.tensorflow.algorithm_step import FlatLayout, StateShapes, float32_gradients
from hvd_compress.tensorflow.bucketed import HyperValues, call_tag
from hvd_compress.tensorflow.functions import numpy_call


class StatefulReduction:
    """The float32 variables of ``shapes`` (in order) as one flat buffer (``layout``), reduced with state."""

    #: State variables that differ between ranks by design (never broadcast).
    per_rank: tuple[str, ...] = ()
    what = "a reduction with state"  # the option that chose it, for messages

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        self.layout = FlatLayout(shapes)

    def state_shapes(self) -> StateShapes:
        raise NotImplementedError

    def run(self, name: str, grads: Sequence[np.ndarray], saved: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reduced gradient of each variable, then the new state in ``state_shapes()`` order, from this rank's
        ``grads`` and the ``saved`` state (TF's input arrays: read, never kept or written)."""
        raise NotImplementedError

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], state: dict[str, Any], name: str,
               hyper: HyperValues | None = None) -> list[Any]:
        """The reduced gradient of every one of ``variables`` (all the variables this was built for, in order;
        ``grads[i]`` None: zeros, decided by the program's structure, so alike on every rank); assigns the new
        state to ``state`` (the variables named as ``state_shapes()``). ``hyper``: the optimizer's hyper-parameters
        that tag the call names (``bucketed_allreduce``'s)."""
        gs = float32_gradients(grads, variables)
        names = list(self.state_shapes())
        touts = [tf.float32] * len(gs) + [tf.as_dtype(state[k].dtype) for k in names]
        tagged = [] if hyper is None else [hyper.values]

        def call(*inputs: np.ndarray) -> list[np.ndarray]:
            tag, arrays = call_tag(hyper, inputs)
            try:
                return self.run(tag.name(name), arrays[: len(gs)], arrays[len(gs):])
            except MismatchError as e:
                raise tag.explained(e, name) from e

        outs = numpy_call(call, [*gs, *(tf.convert_to_tensor(state[k]) for k in names), *tagged], touts, name)
        for k, x in zip(names, outs[len(gs):], strict=True):
            state[k].assign(tf.reshape(x, state[k].shape))
        return [tf.reshape(x, v.shape) for x, v in zip(outs[: len(gs)], variables, strict=True)]
