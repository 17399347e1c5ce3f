"""What the benchmark times: each case is one of our collectives and the Horovod collectives it is
compared with, all applied to the same float32 buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

import hvd_compress.torch as hc

Collective = Callable[[torch.Tensor], object]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    ours: Collective
    baselines: dict[str, Collective]  # label -> Horovod collective; the first is the ratio's denominator


def horovod_average(hvd) -> Collective:
    return lambda t: hvd.allreduce_(t, op=hvd.Average, name="bench.hvd_average")


def cases(hvd) -> list[Case]:
    """All benchmark cases available in this build."""
    # Imported here: onebit_cases imports Case from this module.
    from hvd_compress.bench.birder_cases import birder_cases
    from hvd_compress.bench.compression_cases import compression_cases
    from hvd_compress.bench.onebit_cases import onebit_cases
    from hvd_compress.bench.optimizer_cases import optimizer_cases
    from hvd_compress.bench.slamb_cases import slamb_cases

    return [
        Case(
            name="allreduce Average",
            ours=lambda t: hc.allreduce_(t, op=hc.Average, name="bench.average"),
            baselines={"hvd Average": horovod_average(hvd)},
        ),
        Case(
            name="allreduce Adasum",
            ours=lambda t: hc.allreduce_(t, op=hc.Adasum, name="bench.adasum"),
            baselines={
                "hvd Adasum": lambda t: hvd.allreduce_(t, op=hvd.Adasum, name="bench.hvd_adasum"),
                "hvd Average": horovod_average(hvd),
            },
        ),
        *onebit_cases(hvd),
        *compression_cases(hvd),
        *optimizer_cases(hvd),
        *slamb_cases(hvd),
        *birder_cases(hvd),
    ]
