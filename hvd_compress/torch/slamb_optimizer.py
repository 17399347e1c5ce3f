"""``hc.DistributedOptimizer(hc.Lamb(...), op=hc.SLAMB, ...)``: the PyTorch face of
``hvd_compress.algorithms.slamb`` (paper 000 Algorithm 1 + Appendix E, spec shared/specs/slamb.md).

The algorithm (masks, freshness, phi/eta blending, the sync schedule, finite agreement, the checkpoint
schema) lives in ``hvd_compress/algorithms/slamb.py``. This face does what needs torch: one float32 flat
buffer each for the gradients, m, v, the freshness, the mask and two temporaries over all trainable
parameters in param-group order (every parameter's ``.grad`` and ``state['exp_avg']``/``['exp_avg_sq']`` are
views, so ``state_dict()`` holds them as usual), the gradient hooks, and the ``hvd_compress`` section of
``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.algorithms.slamb import Slamb, SlambBuffers, SlambOptions
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.algorithm_mixin import AlgorithmMixin
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, cached_views
from hvd_compress.torch.lamb import Lamb
from hvd_compress.torch.wrapping import check_named_parameters, hook_gradients


def _buffers(param_groups: list[dict[str, Any]]) -> tuple[SlambBuffers, FusedGradients]:
    params, group_of = [], []
    for gi, group in enumerate(param_groups):
        for p in group["params"]:
            if p.requires_grad:
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise ValueError(f"op=SLAMB supports float32 CPU parameters, got {p.dtype} on {p.device}")
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


class SlambMixin(AlgorithmMixin):
    """Methods added to the wrapped ``hc.Lamb``'s class for ``op=hc.SLAMB``.

    ``synchronize()`` ends the gradient phase: SLAMB never averages a gradient (the masked momentum travels in
    ``step()``), so it only gathers this rank's gradient into ``.grad``; clipping ``.grad`` between it and
    ``step()`` (inside ``skip_synchronize()``) clips this rank's own gradient, as the reference's Swin runs do.
    Parameters are identical on every rank only after a step t with t mod sync_interval == 0 and after
    ``synchronize_parameters()``: call that before evaluating or saving.
    """

    def _hvdc_setup(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
                    backward_passes_per_step: int, options: SlambOptions) -> None:
        ensure_init()
        params = [p for g in self.param_groups for p in g["params"]]
        check_named_parameters(params, named_parameters)
        buffers, fused = _buffers(self.param_groups)
        self._hvdc_grads = [fused]
        self._hvdc_meter = CommMeter()
        self._hvdc_alg = Slamb(options, BACKEND, buffers, ops.size(), self._hvdc_meter)
        self._hvdc_alg.t = self._hvdc_plain_step(super(self.__class__, self).state_dict())
        self._hvdc_bind_state()
        self._hvdc_passes = PassCounter(buffers.params, backward_passes_per_step)
        hook_gradients(buffers.params, self._hvdc_count_pass)

    def _hvdc_bind_state(self) -> None:
        """Make every parameter's m and v views of the flat buffers, keeping their values."""
        b = self._hvdc_alg.buf
        for key, flat in (("exp_avg", b.exp_avg), ("exp_avg_sq", b.exp_avg_sq)):
            for p, view in zip(b.params, b.views(flat), strict=True):
                old = self.state[p].get(key)
                if old is not None and old.data_ptr() != view.data_ptr():
                    view.copy_(old)
                self.state[p][key] = view
        for p in b.params:
            self.state[p]["step"] = torch.tensor(float(self._hvdc_alg.t), dtype=torch.float32)

    @torch.no_grad()
    def synchronize_parameters(self) -> None:
        """Average the parameters over all ranks now (one dense allreduce): at the end of training and before
        evaluating or saving, where the last step was not a multiple of ``sync_interval``."""
        ensure_init()
        self._hvdc_alg.synchronize_parameters()

    def _hvdc_after_step(self, t: int) -> None:
        self._hvdc_fill_step(self._hvdc_alg.buf.params, t)


def check_lamb(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, Lamb):
        raise TypeError(f"op=SLAMB wraps hc.Lamb, got {type(optimizer).__name__}")
