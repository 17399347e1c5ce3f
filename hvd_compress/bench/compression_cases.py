"""Benchmark cases of ``compression=`` on the dense path: ``hc.allreduce_`` with fp16, top-k 1% and random-k 1%
(one persistent ``CompressionState`` per buffer, as an optimizer holds it) against Horovod's dense Average and
Horovod's own fp16 compression of the same buffer. The bytes column is what each call sent."""

from __future__ import annotations

import torch

import hvd_compress.torch as hc
from hvd_compress.bench.cases import Case, horovod_average


def _compressed(compression: hc.Compressor, label: str):
    """In place on the benchmark's buffer; top-k/random-k keep one state per (numel, dtype) across repetitions."""
    states: dict[tuple[int, torch.dtype], hc.CompressionState] = {}

    def run(t: torch.Tensor) -> torch.Tensor:
        state = None
        if compression.stateful:
            key = (t.numel(), t.dtype)
            if key not in states:
                states[key] = hc.CompressionState(t.numel(), compression)
            state = states[key]
        return hc.allreduce_(t, op=hc.Average, compression=compression, state=state, name=f"bench.{label}")

    return run


def compression_cases(hvd) -> list[Case]:
    """The compression cases, for ``hvd_compress.bench.cases.cases`` to include."""

    def horovod_fp16(t: torch.Tensor) -> torch.Tensor:
        return t.copy_(hvd.allreduce(t, op=hvd.Average, compression=hvd.Compression.fp16, name="bench.hvd_fp16"))

    return [
        Case(
            name="allreduce fp16",
            ours=_compressed(hc.Compression.fp16, "fp16"),
            baselines={"hvd Average": horovod_average(hvd), "hvd fp16": horovod_fp16},
        ),
        Case(
            name="allreduce topk 1%",
            ours=_compressed(hc.Compression.topk(0.01), "topk"),
            baselines={"hvd Average": horovod_average(hvd)},
        ),
        Case(
            name="allreduce randomk 1%",
            ours=_compressed(hc.Compression.randomk(0.01, seed=1), "randomk"),
            baselines={"hvd Average": horovod_average(hvd)},
        ),
    ]
