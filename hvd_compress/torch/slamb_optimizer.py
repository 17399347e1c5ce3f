"""``hc.DistributedOptimizer(hc.Lamb(...), op=hc.SLAMB, ...)``: the PyTorch face of
``hvd_compress.algorithms.slamb`` (paper 000 Algorithm 1 + Appendix E, spec shared/specs/slamb.md).

The algorithm (masks, freshness, phi/eta blending, the sync schedule, finite agreement, the buckets, the
checkpoint schema) lives in ``hvd_compress/algorithms/slamb.py``. This face does what needs torch: one float32
flat buffer each for the gradients, m, v, the freshness, the mask and two temporaries over all trainable
parameters in param-group order (every parameter's ``.grad`` and ``state['exp_avg']``/``['exp_avg_sq']`` are
views, so ``state_dict()`` holds them as usual), the cut of those parameters into buckets (``cut_buckets``, as
``op=Average`` cuts its buckets; each bucket a contiguous range of the flat buffers), the gradient hooks that
start a bucket's masked momentum average while backward runs (``hvd_compress.torch.bucketed``), and the
``hvd_compress`` section of ``state_dict()``.
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.algorithms.slamb import Slamb, SlambBucket, SlambBuffers, SlambOptions
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.bucketed import BucketedEngine, cut_buckets
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, cached_views


def _buffers(param_groups: list[dict[str, Any]]) -> tuple[SlambBuffers, FusedGradients]:
    params, group_of = [], []
    for gi, group in enumerate(param_groups):
        for p in group["params"]:
            if p.requires_grad:
                if p.device.type != "cpu":
                    raise ValueError(f"op=SLAMB: a parameter is on {p.device}; this build of hvd_compress handles "
                                     "CPU tensors only (move the model to the CPU)")
                if p.dtype != torch.float32:
                    raise ValueError(f"op=SLAMB supports float32 parameters, got {p.dtype}")
                params.append(p)
                group_of.append(gi)
    fused = FusedGradients(params)
    numel = sum(p.numel() for p in params)
    views = cached_views(params)

    def zeros(dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype)

    grad = fused.buffers[0] if fused.buffers else zeros()
    buffers = SlambBuffers(
        params=params, shapes=[tuple(p.shape) for p in params], group_of=group_of, grad=grad,
        exp_avg=zeros(), exp_avg_sq=zeros(), freshness=zeros(), mask=zeros(torch.bool), work=zeros(),
        scratch=zeros(), views=views,
    )
    return buffers, fused


def _buckets(param_groups: list[dict[str, Any]], buffers: SlambBuffers,
              bucket_mb: float) -> tuple[list[SlambBucket], list[int]]:
    """One bucket per bucket (``cut_buckets``: consecutive parameters of one param group, so a contiguous
    range of the flat buffers), in registration order, and the bucket indices in bucket order."""
    first = {id(p): at for p, at in zip(buffers.params, buffers.offsets, strict=True)}
    planned, order = cut_buckets(param_groups, bucket_mb)
    buckets = [SlambBucket(group=gi, first=first[id(params[0])], sizes=[p.numel() for p in params],
                             params=params) for gi, params in planned]
    at = 0
    for seg in buckets:  # the buckets tile D in order (registration order is param-group order)
        if seg.first != at:
            raise AssertionError(f"SLAMB: bucket at {seg.first} does not follow the previous one (ends at {at})")
        at = seg.end
    return buckets, order


class SlambEngine(BucketedEngine):
    """The engine of ``op=hc.SLAMB`` over a wrapped ``hc.Lamb``.

    The parameters are cut into buckets (``bucket_mb``, as ``op=Average``); with ``overlap=True`` (the default)
    the gradient hook that makes a bucket's last gradient final starts that bucket's steps 3 and 4 (m's new value
    and its masked average under the step's global mask, ``hvd_compress.algorithms.slamb``) on the background
    thread while backward continues; ``synchronize()`` starts what is left and waits for all; ``step()`` does the
    rest. So with overlap, editing ``.grad`` after backward cannot change the step: clip only with
    ``overlap=False``, under which ``synchronize()`` only gathers this rank's gradient into ``.grad`` (SLAMB never
    averages a gradient: the masked momentum travels in ``step()``) and clipping ``.grad`` between it and
    ``step()`` (inside ``skip_synchronize()``) clips this rank's own gradient, as the reference's Swin runs do.
    Both modes make the same calls: bit-identical results.
    Parameters are identical on every rank only after a step t with t mod sync_interval == 0 and after
    ``synchronize_parameters()``: call that before evaluating or saving.
    """

    exports = (*BucketedEngine.exports, "synchronize_parameters")

    def build(self, param_groups: list[dict[str, Any]], algorithm: type[Slamb], options: SlambOptions,
              bucket_mb: float) -> tuple[Slamb, list[SlambBucket], list[FusedGradients], list[int]]:
        ensure_init()
        buffers, fused = _buffers(param_groups)
        buckets, order = _buckets(param_groups, buffers, bucket_mb)
        built = algorithm(options, BACKEND, buckets, self.meter, buffers=buffers, world_size=ops.size())
        return built, buckets, [fused], order

    def bind_state(self) -> None:
        """Make every parameter's m and v views of the flat buffers, keeping their values."""
        b = self.alg.buf
        self.bind_views([(b, [("exp_avg", b.exp_avg), ("exp_avg_sq", b.exp_avg_sq)])])

    @torch.no_grad()
    def synchronize_parameters(self) -> None:
        """Average the parameters over all ranks now (one dense allreduce): at the end of training and before
        evaluating or saving, where the last step was not a multiple of ``sync_interval``. A step whose buckets
        were started but not taken is dropped first (as by ``zero_grad()``)."""
        ensure_init()
        self.alg.abandon()
        self.alg.synchronize_parameters()
