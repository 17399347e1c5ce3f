"""What an algorithm class declares so that every face runs it with no code of its own: its ``op=`` value, the
buffers the face engine that runs it allocates, and the kind of optimizer it wraps (the faces map a kind to their
optimizer classes and read its hyper-parameters into a torch-style param group, the only form an algorithm reads).

A new algorithm on existing buffers and kind is one module plus its line in ``algorithms.REGISTRY``; new
buffers or a new kind are new face code by nature (new buffers, or a new inner optimizer to read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hvd_compress.ops.constants import AlgorithmOp

#: The buffer sets the faces allocate, one engine each: "onebit" (per-bucket m, v and error feedback:
#: ``algorithms.onebit``), "slamb" (element-wise m, v, c over all parameters plus the masks: ``algorithms.slamb``),
#: "flat" (per-bucket flat buffers ``m``, ``b`` and the 1-bit exchange's error: ``algorithms.birder.BirderBucket``),
#: "zeroone" (per-bucket m, v, u, x_anchor, error feedback and sum of lr: ``algorithms.zero_one_adam.ZeroOneBucket``),
#: "lowrank" (op=Average's gradient buckets, each with its error, P and Q: ``algorithms.powersgd``; a reduction:
#: the wrapped optimizer steps on what it returns), "local" (no gradient buffers: the wrapped optimizer steps on each
#: rank's own gradients and fragments of the parameters are synced on a schedule: ``algorithms.diloco``).
BUFFERS = ("onebit", "slamb", "flat", "zeroone", "lowrank", "local")


@dataclasses.dataclass(frozen=True)
class Wraps:
    """The kind of optimizer an algorithm wraps. ``hyper``: the names after lr, in order, that a face reads from the
    wrapped optimizer (a Keras face as a list of values; the torch face has them in its param groups already);
    ``group`` turns (lr, *hyper) and the face's flags into the param group the algorithm reads."""

    kind: str
    hyper: tuple[str, ...]

    def group(self, values: Sequence[float], flags: dict[str, Any]) -> dict[str, Any]:
        lr, *rest = (float(v) for v in values)
        named = dict(zip(self.hyper, rest, strict=True))
        if "beta1" in named:  # torch's Adam/LAMB keep (beta1, beta2) as one "betas"
            named["betas"] = (named.pop("beta1"), named.pop("beta2"))
        return {"lr": lr, **named, **flags}


ADAM = Wraps("adam", ("beta1", "beta2", "eps", "weight_decay"))  # torch Adam/AdamW; Keras Adam/AdamW
LAMB = Wraps("lamb", ("beta1", "beta2", "eps", "weight_decay"))  # hc.Lamb; Keras Lamb (tf_keras: Adam/AdamW)
SLAMB_LAMB = Wraps("slamb-lamb", ("beta1", "beta2", "eps", "weight_decay"))  # as LAMB, Keras 3's Lamb only
BIRDER = Wraps("birder", ("beta", "eps", "weight_decay"))  # hc.Birder / hck.Birder
ANY = Wraps("any", ())  # a reduction: any optimizer steps on the reduced gradients (the face reads nothing of it)
SGD = Wraps("sgd", ())  # plain SGD: lr only (the algorithm's ``check_group`` refuses momentum and decay)


def check_declared(algorithm: type) -> None:
    """TypeError naming what an algorithm class registered in ``algorithms.REGISTRY`` fails to declare."""
    missing = [n for n in ("name", "options_cls", "op", "buffers", "wraps") if not hasattr(algorithm, n)]
    if missing:
        raise TypeError(f"{algorithm.__name__} does not declare {missing}")
    if not isinstance(algorithm.op, AlgorithmOp) or algorithm.op.name != algorithm.name:
        raise TypeError(f"{algorithm.__name__}.op must be AlgorithmOp({algorithm.name!r}, value)")
    if algorithm.buffers not in BUFFERS:
        raise TypeError(f"{algorithm.__name__}.buffers {algorithm.buffers!r} is none of {BUFFERS}")
    if not isinstance(algorithm.wraps, Wraps):
        raise TypeError(f"{algorithm.__name__}.wraps must be a contract.Wraps")
