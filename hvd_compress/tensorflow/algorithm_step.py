"""One step of a segment-based algorithm of ``hvd_compress.algorithms`` (1-bit Adam, 1-bit LAMB) on NumPy copies
of a TF face's variables: the run-time half of ``hvd_compress.keras.DistributedOptimizer``.

The state lives in framework variables (so checkpoints keep it). Each step hands them, the parameters and the
gradients to ``AlgorithmStep.__call__`` inside one ``tf.numpy_function(stateful=True)``; it copies them into
fresh 64-byte aligned arrays (TF's inputs alias its buffers and are never written), builds the algorithm's
``Segment`` over them, runs the algorithm's ``synchronize()`` and ``step()`` (the same code the torch face
runs), and returns the arrays (TF adopts them without a copy; they are never touched again here). Every
step-dependent decision (warm-up or compression, trust-ratio clipping) is made there, at run time.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from hvd_compress.algorithms.onebit import OneBitAlgorithm, Segment
from hvd_compress.ops import onebit as onebit_ops
from hvd_compress.tensorflow.backend import BACKEND, aligned_empty


@dataclasses.dataclass(frozen=True)
class Layout:
    """The fused layout of one segment: the parameters' sizes in order, and which state buffers it keeps."""

    sizes: tuple[int, ...]
    world_size: int
    fresh: bool  # a fresh-variance buffer (1-bit LAMB)

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def server_numel(self) -> int:
        return onebit_ops.server_error_numel(self.numel, self.world_size)

    def state_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, dtype) of each state variable the face keeps for this segment, in call order."""
        n, layers = self.numel, len(self.sizes)
        shapes = {"exp_avg": ((n,), "float32"), "exp_avg_sq": ((n,), "float32")}
        if self.fresh:
            shapes["exp_avg_sq_fresh"] = ((n,), "float32")
        shapes.update(
            worker_error=((n,), "float32"),
            server_error=((self.server_numel,), "float32"),
            step=((), "int64"),
            lamb_coeff_freeze=((layers,), "float64"),
            last_factor=((layers,), "float64"),
        )
        return shapes


def _fresh_copy(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    out = aligned_empty(x.size, dtype or x.dtype)
    np.copyto(out, np.asarray(x).reshape(-1), casting="unsafe")
    return out


class _Errors:
    """The 1-bit error feedback of one step over fresh arrays (what ``OneBitState`` holds in the torch face)."""

    def __init__(self, worker_error: np.ndarray, server_error: np.ndarray) -> None:
        self.worker_error = worker_error
        self.server_error = server_error


class AlgorithmStep:
    """Runs ``algorithm`` (built with its options and the NumPy backend) for one fused segment per call."""

    def __init__(self, algorithm: OneBitAlgorithm, layout: Layout) -> None:
        self.algorithm = algorithm
        self.layout = layout

    def group(self, hyper: np.ndarray, flags: dict[str, Any]) -> dict[str, Any]:
        lr, b1, b2, eps, wd = (float(h) for h in np.asarray(hyper, dtype=np.float64))
        return {"lr": lr, "betas": (b1, b2), "eps": eps, "weight_decay": wd, **flags}

    def __call__(self, flags: dict[str, Any], hyper: np.ndarray, grads: Sequence[np.ndarray],
                 params: Sequence[np.ndarray], state: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Returns the new parameters (flat per parameter) then the new state, in ``state_shapes`` order."""
        lay = self.layout
        offsets = np.cumsum((0, *lay.sizes))
        cuts = list(itertools.pairwise(int(o) for o in offsets))
        x = aligned_empty(lay.numel, np.float32)
        g = aligned_empty(lay.numel, np.float32)
        for (lo, hi), p, gr in zip(cuts, params, grads, strict=True):
            x[lo:hi] = np.asarray(p).reshape(-1)
            g[lo:hi] = np.asarray(gr).reshape(-1)
        names = list(lay.state_shapes())
        saved = dict(zip(names, state, strict=True))
        bufs = {k: _fresh_copy(saved[k]) for k in names if k not in ("step", "lamb_coeff_freeze", "last_factor")}

        def views(flat: np.ndarray) -> list[np.ndarray]:
            return [flat[lo:hi] for lo, hi in cuts]

        seg = Segment(
            group=0,
            params=views(x),
            sizes=list(lay.sizes),
            grad=g,
            exp_avg=bufs["exp_avg"],
            exp_avg_sq=bufs["exp_avg_sq"],
            fresh=bufs.get("exp_avg_sq_fresh"),
            work=BACKEND.float32_like(lay.numel, None),
            scratch=BACKEND.float32_like(lay.numel, None),
            onebit=_Errors(bufs["worker_error"], bufs["server_error"]),
            views=views,
            lamb_coeff_freeze=[float(c) for c in np.asarray(saved["lamb_coeff_freeze"])],
            last_factor=[float(c) for c in np.asarray(saved["last_factor"])],
        )
        alg = self.algorithm
        alg.segments = [seg]
        alg.t = int(saved["step"])
        alg.synchronize()
        t = alg.step([self.group(hyper, flags)])
        new_state = {**bufs, "step": np.asarray(t, dtype=np.int64),
                     "lamb_coeff_freeze": _fresh_copy(np.asarray(seg.lamb_coeff_freeze, dtype=np.float64)),
                     "last_factor": _fresh_copy(np.asarray(seg.last_factor, dtype=np.float64))}
        alg.segments = []  # the arrays now belong to TF
        return [*views(x), *(new_state[k] for k in names)]
