"""Backward passes per parameter between two steps (``backward_passes_per_step``), framework-neutral:
parameters are told apart by identity."""

from __future__ import annotations

from collections.abc import Iterable


class PassCounter:
    """Counts backward passes per parameter and refuses more than ``limit`` before a step."""

    def __init__(self, params: Iterable[object], limit: int) -> None:
        self.counts = {id(p): 0 for p in params}
        self.set_limit(limit)

    def set_limit(self, limit: int) -> None:
        """From now on, ``limit`` passes per step (the passes so far are forgotten)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {limit!r}")
        self.limit = limit
        self.reset()

    def add(self, p: object) -> int:
        n = self.counts[id(p)] + 1
        if n > self.limit:
            raise RuntimeError(
                f"gradients were computed {n} times before step(); with backward_passes_per_step="
                f"{self.limit} call step() (or synchronize()) every {self.limit} backward passes"
            )
        self.counts[id(p)] = n
        return n

    def reset(self) -> None:
        for k in self.counts:
            self.counts[k] = 0
