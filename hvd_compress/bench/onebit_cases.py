"""Benchmark case of the 1-bit compressed allreduce: ``hc.compressed_allreduce`` with a persistent
``OneBitState`` (as an optimizer would hold it) against Horovod's dense Average of the same buffer."""

from __future__ import annotations

import torch

from hvd_compress.bench.cases import Case, horovod_average
from hvd_compress.torch.onebit import OneBitState, compressed_allreduce_


def _onebit_in_place():
    """In place on the benchmark's buffer; one state per (numel, dtype), kept across repetitions."""
    states: dict[tuple[int, torch.dtype], OneBitState] = {}

    def run(t: torch.Tensor) -> torch.Tensor:
        key = (t.numel(), t.dtype)
        if key not in states:
            states[key] = OneBitState(t.numel(), t.dtype)
        return compressed_allreduce_(t, states[key], name="bench.onebit")

    return run


def onebit_cases(hvd) -> list[Case]:
    """The 1-bit cases, for ``hvd_compress.bench.cases.cases`` to include."""
    return [
        Case(
            name="compressed_allreduce 1-bit",
            ours=_onebit_in_place(),
            baselines={"hvd Average": horovod_average(hvd)},
        )
    ]
