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
from hvd_compress.torch.backend import BACKEND
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, views_into
from hvd_compress.torch.lamb import Lamb
from hvd_compress.torch.wrapping import STATE_KEY, SynchronizeProtocol, check_named_parameters, hook_gradients


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
    cache: dict[int, list[torch.Tensor]] = {}

    def views(flat: torch.Tensor) -> list[torch.Tensor]:
        key = flat.data_ptr()
        if key not in cache:
            cache[key] = views_into(flat, params)
        return cache[key]

    def zeros(dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype)

    grad = fused.buffers[0] if fused.buffers else zeros()
    buffers = SlambBuffers(
        params=params, shapes=[tuple(p.shape) for p in params], group_of=group_of, grad=grad,
        exp_avg=zeros(), exp_avg_sq=zeros(), freshness=zeros(), mask=zeros(torch.bool), work=zeros(),
        scratch=zeros(), views=views,
    )
    return buffers, fused


class SlambMixin(SynchronizeProtocol):
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
        buffers, self._hvdc_grads = _buffers(self.param_groups)
        self._hvdc_meter = CommMeter()
        self._hvdc_alg = Slamb(options, BACKEND, buffers, ops.size(), self._hvdc_meter)
        self._hvdc_alg.t = self._hvdc_plain_step(super(self.__class__, self).state_dict())
        self._hvdc_bind_state()
        self._hvdc_passes = PassCounter(buffers.params, backward_passes_per_step)
        hook_gradients(buffers.params, self._hvdc_count_pass)

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        self._hvdc_passes.add(p)
        self._hvdc_synchronized = False

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
    def synchronize(self) -> None:
        """End the gradient phase: gather this rank's gradients (SLAMB sends none)."""
        ensure_init()
        self._hvdc_grads.gather()
        self._hvdc_passes.reset()
        self._hvdc_mark_synchronized()

    @torch.no_grad()
    def synchronize_parameters(self) -> None:
        """Average the parameters over all ranks now (one dense allreduce): at the end of training and before
        evaluating or saving, where the last step was not a multiple of ``sync_interval``."""
        ensure_init()
        self._hvdc_alg.synchronize_parameters()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._hvdc_synchronize_for_step()
        t = self._hvdc_alg.step(self.param_groups)
        for p in self._hvdc_alg.buf.params:
            self.state[p]["step"].fill_(float(t))
        self._hvdc_step_done()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffer in place (gradients stay views, never None)."""
        del set_to_none  # views must survive
        self._hvdc_grads.zero_()
        self._hvdc_passes.reset()
        self._hvdc_step_done()

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self._hvdc_meter.take()

    def state_dict(self) -> dict[str, Any]:
        out = super(self.__class__, self).state_dict()
        out[STATE_KEY] = self._hvdc_alg.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; one without the SLAMB section (a plain ``hc.Lamb`` checkpoint) starts the
        freshness at 1. A checkpoint of another algorithm, world size, model size, seed or mask raises
        ValueError with nothing changed."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        if not hasattr(self, "_hvdc_alg"):  # rewrap() loading the wrapped optimizer's state
            return super(self.__class__, self).load_state_dict(state_dict)
        t = 0
        if ours is not None:
            self._hvdc_alg.check_state_dict(ours)
        else:
            t = self._hvdc_plain_step(state_dict)
        super(self.__class__, self).load_state_dict(state_dict)
        self._hvdc_alg.load_state_dict(ours, t)
        self._hvdc_bind_state()

    def _hvdc_plain_step(self, state_dict: dict[str, Any]) -> int:
        steps = [float(s["step"]) for s in state_dict.get("state", {}).values() if "step" in s]
        return int(max(steps)) if steps else 0


def check_lamb(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, Lamb):
        raise TypeError(f"op=SLAMB wraps hc.Lamb, got {type(optimizer).__name__}")
