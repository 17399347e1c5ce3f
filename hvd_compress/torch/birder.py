"""PyTorch face of Birder (paper 004): the optimizer ``hc.Birder`` (the uncompressed rule) and the engine of
``hc.DistributedOptimizer(hc.Birder(...), op=hc.Birder)`` (the 1-bit algorithm).

The math and the sequencing are ``hvd_compress.algorithms.birder``'s; this face keeps the tensors: per
bucket of each param group one bucket of flat float32 buffers (the fused gradient of which every ``.grad`` is a
view, the update, and the sharded m, b and error feedback), the gradient hooks that start a bucket's core call
during backward (``overlap``, ``hvd_compress.torch.bucketed``), and the ``hvd_compress`` section of
``state_dict()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hvd_compress.algorithms import birder as alg
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.bucketed import BucketedEngine, make_buckets
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, cached_views


class Birder(torch.optim.Optimizer):
    """Birder's rule without compression (SoftSignSGD, paper 004): m and b moving averages of g and |g| with
    one beta, x = x - lr m / (b + eps) - lr weight_decay x (decoupled). Defaults: specs/birder.md section 5.

    Wrapped by ``hc.DistributedOptimizer(..., op=hc.Birder)`` it becomes the 1-bit algorithm; under
    ``op=hc.Average`` it steps on the averaged gradient."""

    hvdc_op = alg.BirderAlgorithm.op  # as op=, the class names its algorithm

    def __init__(self, params: Any, lr: float = 1e-3, beta: float = 0.95, eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        alg.check_hyperparameters(lr, beta, eps, weight_decay)
        super().__init__(params, {"lr": lr, "beta": beta, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            alg.check_hyperparameters(group["lr"], group["beta"], group["eps"], group["weight_decay"])
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_abs"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            alg.uncompressed_step(
                BACKEND, params, [p.grad for p in params], [self.state[p]["exp_avg"] for p in params],
                [self.state[p]["exp_avg_abs"] for p in params], [torch.empty_like(p) for p in params], group,
            )
        return loss


def _zeros(numel: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(numel, dtype=torch.float32, device=device)


def _bucket(hierarchical: bool, gi: int, params: list[torch.nn.Parameter],
             fused: FusedGradients) -> alg.BirderBucket:
    """One bucket's bucket (``make_buckets``): m, b and the errors this rank keeps of it."""
    numel = sum(p.numel() for p in params)
    c1, c2 = alg.BirderAlgorithm.state_numels(numel, hierarchical)
    device = fused.buffers[0].device
    return alg.BirderBucket(
        group=gi, params=params, sizes=[p.numel() for p in params], grad=fused.buffers[0],
        update=_zeros(numel, device), m=_zeros(c1, device), b=_zeros(c1, device),
        worker_error=_zeros(c1, device), server_error=_zeros(c2, device), views=cached_views(params),
    )


class BirderEngine(BucketedEngine):
    """The engine of a wrapped ``hc.Birder`` under ``op=hc.Birder`` (paper 004 Alg. 1, 1-bit both ways).

    The parameters are cut into buckets (``bucket_mb``, as ``op=Average``), each with its own m, b
    and error feedback (``hvd_compress.algorithms.birder``: buckets are buckets). With ``overlap=True`` (the
    default) the gradient hook that makes a bucket's last gradient final starts that bucket's core call (this
    rank's gradient in, the update u out; m, b and the errors updated inside) on the background thread while
    backward continues; ``synchronize()`` starts what is left and waits for all; ``step()`` applies
    x -= lr u + lr wd x. So with overlap, editing ``.grad`` after backward cannot change the step: clip only with
    ``overlap=False``, under which ``synchronize()`` only gathers this rank's gradient into ``.grad`` (nothing is
    averaged densely) and clipping between ``synchronize()`` and ``step()`` clips each rank's own gradient before it
    enters the moments. Both modes make the same calls: bit-identical results.
    """

    exports = (*BucketedEngine.exports, "birder_step")
    mirrors_step = False  # hc.Birder keeps its own step; Birder's errors and moments cannot start afresh mid-run

    def build(self, param_groups: list[dict[str, Any]], algorithm: type[alg.BirderAlgorithm],
              options: alg.BirderOptions, bucket_mb: float
              ) -> tuple[alg.BirderAlgorithm, list[alg.BirderBucket], list[FusedGradients], list[int]]:
        ensure_init()
        buckets, grads, order = make_buckets(param_groups, bucket_mb, (torch.float32,),
                                                 "op=Birder supports float32 parameters only",
                                                 functools.partial(_bucket, options.hierarchical))
        return algorithm(options, BACKEND, buckets, self.meter), buckets, grads, order

    @property
    def birder_step(self) -> int:
        """Steps taken (with the seed, the RNG position)."""
        return self.alg.t
