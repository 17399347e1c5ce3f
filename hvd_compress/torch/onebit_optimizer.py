"""``hc.DistributedOptimizer(op=hc.OneBitAdam | hc.OneBitLamb)``: the PyTorch face of
``hvd_compress.algorithms.onebit_adam`` / ``onebit_lamb`` (papers 003 and 001, Algorithm 1 each).

The algorithms (both stages, the ``compress`` rule, the buckets' reductions, the checkpoint schema) live in
``hvd_compress/algorithms``. This face does what needs torch: for each bucket of each (param group, dtype) one
bucket of flat gradient, momentum and variance buffers of which every parameter's ``.grad`` and
``state['exp_avg']``/``['exp_avg_sq']`` are views (so one collective call per bucket and step moves all
of them, and ``state_dict()`` holds them as usual), the error feedback in ``OneBitState``, the gradient
hooks that start a bucket's reduction during backward (``overlap``), and the ``hvd_compress`` section of
``state_dict()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hvd_compress.algorithms import OneBitAlgorithm
from hvd_compress.algorithms.onebit import OneBitBucket, OneBitOptions
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.bucketed import BucketedEngine, make_buckets
from hvd_compress.torch.fused import FusedGradients, cached_views, flat_with_views
from hvd_compress.torch.onebit import OneBitState

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _bucket(fresh: bool, gi: int, params: list[torch.nn.Parameter], fused: FusedGradients) -> OneBitBucket:
    """One bucket's bucket (``make_buckets``): its m, v (and fresh v) as flat buffers the state views."""
    numel = sum(p.numel() for p in params)
    exp_avg, _ = flat_with_views(params)
    return OneBitBucket(
        group=gi,
        params=params,
        sizes=[p.numel() for p in params],
        grad=fused.buffers[0],
        exp_avg=exp_avg,
        exp_avg_sq=flat_with_views(params)[0],
        fresh=flat_with_views(params)[0] if fresh else None,
        work=torch.empty(numel, dtype=torch.float32, device=exp_avg.device),
        scratch=torch.empty(numel, dtype=torch.float32, device=exp_avg.device),
        onebit=OneBitState(numel, torch.float32, device=exp_avg.device),
        views=cached_views(params),
    )


class OneBitEngine(BucketedEngine):
    """The engine of a 1-bit algorithm (``OneBitAdam``, ``OneBitLamb``).

    The parameters are cut into buckets (``bucket_mb``, as ``op=Average``), each one bucket of the algorithm
    with its own error feedback (``hvd_compress.algorithms.onebit``: buckets are buckets).

    With ``overlap=True`` (the default) the gradient hook that makes a bucket's last gradient final starts that
    bucket's reduction on the background thread while backward continues: in warm-up the dense average of its
    gradients, in the compression stage its local momentum m_r = b1 m + (1 - b1) g_r, formed from ``.grad``
    there, through the 1-bit compressed allreduce. ``synchronize()`` starts what is left and waits for all;
    ``step()`` applies the update. So with overlap, an edit of ``.grad`` between ``synchronize()`` and ``step()``
    (Horovod's clipping pattern) comes after the compression stage's momentum was sent: ``step()`` then drops
    that exchange (state restored) and reduces the edited gradients again, on every rank; ``overlap=False``
    clips at the cost of one exchange.

    With ``overlap=False`` the same buckets are reduced after backward, with bit-identical results.
    ``synchronize()`` ends the gradient phase of the coming step. In warm-up it averages the gradients densely into
    ``.grad``, as ``op=hc.Average`` does; in the compression stage no gradient is ever averaged (the momentum is
    what travels, in ``step()``), so it only gathers this rank's gradient into ``.grad``. Either way ``.grad``
    then holds what ``step()`` will use, and clipping it between ``synchronize()`` and ``step()`` (inside
    ``skip_synchronize()``) clips that: the averaged gradient in warm-up, each rank's own gradient before its
    momentum is formed after.
    """

    exports = (*BucketedEngine.exports, "freeze_step", "compression_started")

    def build(self, param_groups: list[dict[str, Any]], algorithm: type[OneBitAlgorithm], options: OneBitOptions,
              bucket_mb: float) -> tuple[OneBitAlgorithm, list[OneBitBucket], list[FusedGradients], list[int]]:
        buckets, grads, order = make_buckets(
            param_groups, bucket_mb, _DTYPES, "1-bit optimizers support float32, float16 and bfloat16 parameters, not "
            "{dtype}", functools.partial(_bucket, algorithm.has_fresh_variance))
        return algorithm(options, BACKEND, buckets, self.meter), buckets, grads, order

    def bind_state(self) -> None:
        """Make every parameter's m, v (and 1-bit LAMB's fresh v) views of the bucket buffers, keeping their
        values."""
        self.bind_views((seg, [("exp_avg", seg.exp_avg), ("exp_avg_sq", seg.exp_avg_sq),
                               *([("exp_avg_sq_fresh", seg.fresh)] if seg.fresh is not None else [])])
                        for seg in self.alg.buckets)

    @property
    def freeze_step(self) -> int:
        return self.alg.freeze_step

    @property
    def compression_started(self) -> bool:
        """True once the steps use the 1-bit compressed allreduce (after ``freeze_step`` steps)."""
        return self.alg.compression_started
