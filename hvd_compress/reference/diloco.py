"""Reference DiLoCo and Streaming DiLoCo (hvd_compress/algorithms/diloco.py) over n virtual ranks in one process.

Written from the rules as issue 59 states them from the papers (arXiv 2311.08105, Algorithm 1; arXiv 2501.18512,
Sections 2.2 to 2.4), independently of the algorithm module: each virtual rank holds its parameters as one flat
float32 vector and steps it with ``inner_step(rank, step, params)``; every ``sync_every`` steps, per fragment at its
offset, the outer gradient synced - local is averaged (exactly, rounded once to float32, as ``reference.allreduce``;
16-bit wire formats as ``reference.compression.half_wire_allreduce``, int8/int4 as
``reference.block_quant``), an outer Nesterov SGD steps the synced copy,
and after ``sync_delay`` further inner steps each rank's fragment becomes (1 - mix) synced + mix local.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hvd_compress.reference.allreduce import allreduce
from hvd_compress.reference.block_quant import block_quant_allreduce
from hvd_compress.reference.compression import half_wire_allreduce
from hvd_compress.reference.dtypes import round_to

WIRE = {"fp16": "float16", "bf16": "bfloat16"}


def fragment_index(sizes: Sequence[int], fragments: int) -> list[np.ndarray]:
    """The flat element indices of each fragment, parameter i (of ``sizes``) in fragment i mod ``fragments``."""
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return [np.concatenate([np.arange(starts[i], starts[i + 1]) for i in range(f, len(sizes), fragments)]
                           or [np.zeros(0, np.int64)]) for f in range(fragments)]


class ReferenceDiLoCo:
    """n virtual ranks of DiLoCo over a flat parameter vector cut into parameters of ``sizes``."""

    def __init__(self, params: list[np.ndarray], sizes: Sequence[int], sync_every: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True, fragments: int = 1, sync_delay: int = 0,
                 mix: float = 0.0, outer_compression: str = "none",
                 outer: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None) -> None:
        """``outer``: an outer optimizer in place of the Nesterov SGD, (fragment, synced, averaged outer gradient)
        -> the new synced copy of that fragment."""
        self.params = [np.array(p, dtype=np.float32) for p in params]
        self.n = len(params)
        self.h, self.lr, self.mu, self.nesterov = sync_every, outer_lr, outer_momentum, nesterov
        self.fragments, self.tau, self.mix, self.wire = fragments, sync_delay, mix, outer_compression
        self.index = fragment_index(sizes, fragments)
        self.outer = outer
        self.step = 0
        self.synced: list[np.ndarray] | None = None
        self.momentum: list[np.ndarray] = []
        self.error: list[list[np.ndarray]] = []  # [rank][fragment]
        self.pending: dict[int, tuple[int, np.ndarray]] = {}  # fragment -> (start step, averaged outer gradient)

    def offset(self, f: int) -> int:
        return ((f + 1) * self.h // self.fragments) % self.h

    def run(self, inner_step: Callable[[int, int, np.ndarray], np.ndarray]) -> list[np.ndarray]:
        """One step of every rank; returns each rank's parameters after it."""
        if self.synced is None:  # theta_synced: the parameters at the first step (rank 0's = everyone's)
            self.synced = [self.params[0][ix].copy() for ix in self.index]
            self.momentum = [np.zeros_like(s) for s in self.synced]
            self.error = [[np.zeros_like(s) for s in self.synced] for _ in range(self.n)]
        self.params = [np.asarray(inner_step(r, self.step, p), dtype=np.float32) for r, p in enumerate(self.params)]
        self.step += 1
        for f in sorted(self.pending):
            if self.pending[f][0] + self.tau <= self.step:
                self._outer(f, self.pending.pop(f)[1])
        for f in range(self.fragments):
            if self.step % self.h == self.offset(f):
                self.pending[f] = (self.step, self._average(f))
                if self.tau == 0:
                    self._outer(f, self.pending.pop(f)[1])
        return [p.copy() for p in self.params]

    def _average(self, f: int) -> np.ndarray:
        ix = self.index[f]
        deltas = [self.synced[f] - p[ix] for p in self.params]
        if self.wire == "none":
            return allreduce(deltas)[0].astype(np.float32)
        if self.wire in ("int8", "int4"):
            out, errors = block_quant_allreduce(deltas, [e[f] for e in self.error], int(self.wire[3:]))
            for r, e in enumerate(errors):
                self.error[r][f] = e
            return out
        sent = []
        for r, d in enumerate(deltas):
            c = d + self.error[r][f]
            q = round_to(c, WIRE[self.wire]).astype(np.float32)
            self.error[r][f] = c - q
            sent.append(q)
        return np.asarray(half_wire_allreduce(sent, "float32", self.wire, "Average"), dtype=np.float32)

    def _outer(self, f: int, g: np.ndarray) -> None:
        if self.outer is not None:
            self.synced[f] = np.asarray(self.outer(f, self.synced[f].copy(), g), dtype=np.float32)
        else:
            mu, lr = np.float32(self.mu), np.float32(self.lr)
            self.momentum[f] = mu * self.momentum[f] + g
            step = g + mu * self.momentum[f] if self.nesterov else self.momentum[f]
            self.synced[f] = self.synced[f] - lr * step
        ix = self.index[f]
        for p in self.params:
            if self.mix == 0:
                p[ix] = self.synced[f]
            else:
                p[ix] = np.float32(1 - self.mix) * self.synced[f] + np.float32(self.mix) * p[ix]

    def load(self, state: dict[str, Any], params: list[np.ndarray]) -> None:
        """Continue from a saved ``DiLoCoState.state_dict()`` (arrays as NumPy) with each rank's ``params``."""
        self.params = [np.array(p, dtype=np.float32) for p in params]
        self.n = len(params)
        self.step = int(state["step"])
        self.synced = [np.array(x, np.float32) for x in state["synced"]]
        self.momentum = [np.array(x, np.float32) for x in state["momentum"] or []]
        self.error = [[np.zeros_like(s) for s in self.synced] for _ in range(self.n)]
        self.pending = {int(f): (int(s), np.array(a, np.float32)) for f, (s, a) in state["averaged"].items()}
