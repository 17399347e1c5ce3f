"""PowerSGD for the Keras wrappers (``hck.DistributedOptimizer(opt, op=hc.PowerSGD, ...)``): the rule of
``hvd_compress.algorithms.powersgd`` over one bucket holding every float32 variable, with its state (error, P, Q,
step, seed stream) in the optimizer's own variables, so that Keras checkpoints keep it.

Each step is one call of ``tensorflow.stateful_reduction`` after backward: the matrix work
is NumPy's (``NumpyMatrices``) and the allreduces the core's, as for top-k (``tensorflow.error_feedback``). The first
random Q come from NumPy's generator (``default_rng(seed)``), not torch's, so a Keras run and a torch run draw
different first Q; everything else is the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hvd_compress import ops
from hvd_compress.algorithms import powersgd
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.tensorflow.algorithm_step import StateShapes
from hvd_compress.tensorflow.stateful_reduction import StatefulReduction

_MT_KEYS = 624  # words of the MT19937 state of the seed stream


class NumpyMatrices:
    """``powersgd.MatrixBackend`` on NumPy arrays (in their dtype)."""

    @staticmethod
    def empty_like(numel: int, like: np.ndarray) -> np.ndarray:
        return np.empty(numel, dtype=like.dtype)

    @staticmethod
    def clone(x: np.ndarray) -> np.ndarray:
        return x.copy()

    @staticmethod
    def add_(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x += y
        return x

    @staticmethod
    def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a - b

    @staticmethod
    def view(flat: np.ndarray, offset: int, shape: Sequence[int]) -> np.ndarray:
        return flat[offset : offset + int(np.prod(shape, dtype=np.int64))].reshape(shape)

    @staticmethod
    def cat(tensors: Sequence[np.ndarray], like: np.ndarray) -> np.ndarray:
        return np.concatenate([t.reshape(-1) for t in tensors]) if tensors else np.empty(0, like.dtype)

    @staticmethod
    def split_(flat: np.ndarray, tensors: Sequence[np.ndarray]) -> None:
        offset = 0
        for t in tensors:
            t[...] = flat[offset : offset + t.size].reshape(t.shape)
            offset += t.size

    @staticmethod
    def mul_(x: np.ndarray, factor: float) -> np.ndarray:
        x *= np.float32(factor)
        return x

    @staticmethod
    def all_finite(x: np.ndarray) -> bool:
        return bool(np.isfinite(x).all())

    @staticmethod
    def randn_(seed: int, outs: Sequence[np.ndarray]) -> None:
        gen = np.random.default_rng(seed)
        for q in outs:
            q[...] = gen.standard_normal(q.shape, dtype=np.float32)

    @staticmethod
    @np.errstate(invalid="ignore", over="ignore")  # an inf in a gradient: reduce_bucket hands the NaN on itself
    def orthogonalize_(x: np.ndarray, epsilon: float) -> None:
        rank = x.shape[1]
        if rank > 2:
            x[...] = np.linalg.qr(x)[0]
            return
        for i in range(rank):  # Gram-Schmidt, as torch's hook; a zero column stays zero, not 0 / 0
            col = x[:, i : i + 1]
            norm = np.linalg.norm(col)
            col /= norm + epsilon if epsilon else max(norm, np.finfo(x.dtype).tiny)
            if i + 1 < rank:
                rest = x[:, i + 1 :]
                rest -= np.sum(col * rest, axis=0, keepdims=True) * col

    @staticmethod
    def keep_if_zero_column_(new: np.ndarray, old: np.ndarray) -> None:
        if (new == 0).all(axis=0).any():
            new[...] = old

    @staticmethod
    @np.errstate(invalid="ignore", over="ignore")
    def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, transpose_a: bool = False,
               transpose_b: bool = False) -> np.ndarray:
        return np.matmul(a.T if transpose_a else a, b.T if transpose_b else b, out=out)


class PowerSGDReduction(StatefulReduction):
    """op=PowerSGD over the float32 variables of ``shapes`` (in order), one bucket."""

    #: State variables that differ between ranks by design (never broadcast).
    per_rank = ("powersgd_error",)
    what = "op=PowerSGD"

    def __init__(self, options: powersgd.PowerSGDOptions, shapes: Sequence[tuple[int, ...]],
                 meter: CommMeter) -> None:
        super().__init__(shapes)
        self.options, self.meter = options, meter
        self.plan = powersgd.plan_bucket(self.layout.shapes, options)
        self.matrices = NumpyMatrices()

    def state_shapes(self) -> StateShapes:
        return {
            "powersgd_error": ((self.layout.numel,), "float32", "zeros"),
            "powersgd_p": ((max(self.plan.p_size, 1),), "float32", "zeros"),
            "powersgd_q": ((max(self.plan.q_size, 1),), "float32", "zeros"),
            "powersgd_iter": ((), "int64", "zeros"),
            # The seed stream (MT19937: its key words and position); all zero means "not started".
            "powersgd_rng": ((_MT_KEYS + 1,), "int64", "zeros"),
        }

    def _state(self, error: np.ndarray, p: np.ndarray, q: np.ndarray, it: int,
               rng: np.ndarray) -> powersgd.PowerSGDState:
        """The algorithm's state object from the variables' values: the error once a compressed step has run, P and Q
        once one has run with warm start (they are zeros before)."""
        opt = self.options
        state = powersgd.PowerSGDState(opt, iter=it)
        if rng.any():
            state.rng.set_state(("MT19937", rng[:_MT_KEYS].astype(np.uint32), int(rng[_MT_KEYS]), 0, 0.0))
        ran = it > opt.start_powerSGD_iter
        if ran and opt.use_error_feedback:
            state.errors[0] = error
        if ran and opt.warm_start:
            state.p_memory[0], state.q_memory[0] = p[: self.plan.p_size], q[: self.plan.q_size]
        return state

    def run(self, name: str, grads: Sequence[np.ndarray], saved: Sequence[np.ndarray]) -> list[np.ndarray]:
        error, p, q, it, rng = saved
        flat = self.layout.flatten(grads)
        state = self._state(np.array(error, np.float32).reshape(-1), np.array(p, np.float32).reshape(-1),
                            np.array(q, np.float32).reshape(-1), int(it), np.asarray(rng, np.int64))

        def allreduce(tensor: np.ndarray, average: bool, what: str) -> None:
            self.meter.run(ops.allreduce_, tensor, op=ReduceOp.Average if average else ReduceOp.Sum, name=name)

        powersgd.reduce_bucket(self.matrices, state, 0, flat, self.layout.shapes, allreduce)
        state.step_done()
        out = [np.ascontiguousarray(v) for v in self.layout.views(flat)]
        out.append(np.array(state.errors.get(0, np.zeros(self.layout.numel, np.float32)), np.float32))
        for key, size in (("p", self.plan.p_size), ("q", self.plan.q_size)):
            memory = (state.p_memory if key == "p" else state.q_memory).get(0)
            padded = np.zeros(max(size, 1), np.float32)
            if memory is not None:
                padded[:size] = memory
            out.append(padded)
        out.append(np.asarray(state.iter, dtype=np.int64))
        _, keys, pos, _, _ = state.rng.get_state(legacy=True)
        out.append(np.concatenate([keys.astype(np.int64), [pos]]).astype(np.int64))
        return out
