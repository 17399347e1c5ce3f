"""``hc.DistributedOptimizer(op=hc.OneBitAdam | hc.OneBitLamb)``: the PyTorch face of
``hvd_compress.algorithms.onebit_adam`` / ``onebit_lamb`` (papers 003 and 001, Algorithm 1 each).

The algorithms (both stages, the ``compress`` rule, finite agreement, the checkpoint schema) live in
``hvd_compress/algorithms``. This face does what needs torch: for each (param group, dtype) one segment of
flat gradient, momentum and variance buffers of which every parameter's ``.grad`` and
``state['exp_avg']``/``['exp_avg_sq']`` are views (so one collective call per segment and step moves all
of them, and ``state_dict()`` holds them as usual), the error feedback in ``OneBitState``, the gradient
hooks, and the ``hvd_compress`` section of ``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress.algorithms import OneBitAlgorithm
from hvd_compress.algorithms.onebit import Segment
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.fused import FusedGradients, flat_with_views, views_into
from hvd_compress.torch.lamb import Lamb
from hvd_compress.torch.onebit import OneBitState
from hvd_compress.torch.wrapping import (
    STATE_KEY,
    SynchronizeProtocol,
    check_named_parameters,
    hook_gradients,
)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _segment_views(params: list[torch.nn.Parameter]) -> Any:
    """``views(flat)`` for a segment: made once per buffer (the buffers live as long as the segment, and
    the views are needed several times every step)."""
    cache: dict[int, list[torch.Tensor]] = {}

    def views(flat: torch.Tensor) -> list[torch.Tensor]:
        key = flat.data_ptr()
        if key not in cache:
            cache[key] = views_into(flat, params)
        return cache[key]

    return views


def _segments(param_groups: list[dict[str, Any]], fresh: bool) -> tuple[list[Segment], list[FusedGradients]]:
    segments, grads = [], []
    for gi, group in enumerate(param_groups):
        by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in group["params"]:
            if p.requires_grad:
                by_dtype.setdefault((p.dtype, p.device), []).append(p)
        for (dtype, _), params in by_dtype.items():
            if dtype not in _DTYPES:
                raise ValueError(f"1-bit optimizers support float32, float16 and bfloat16 parameters, not {dtype}")
            fused = FusedGradients(params)
            numel = sum(p.numel() for p in params)
            exp_avg, _ = flat_with_views(params)
            segments.append(
                Segment(
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
                    views=_segment_views(params),
                )
            )
            grads.append(fused)
    return segments, grads


class OneBitMixin(SynchronizeProtocol):
    """Methods added to the wrapped optimizer's class for a 1-bit algorithm (``OneBitAdam``, ``OneBitLamb``).

    ``synchronize()`` ends the gradient phase of the coming step. In warm-up it averages the gradients
    densely into ``.grad``, as ``op=hc.Average`` does; in the compression stage no gradient is ever
    averaged (the momentum is what travels, in ``step()``), so it only gathers this rank's gradient into
    ``.grad``. Either way ``.grad`` then holds what ``step()`` will use, and clipping it between
    ``synchronize()`` and ``step()`` (inside ``skip_synchronize()``) clips that: the averaged gradient in
    warm-up, each rank's own gradient before its momentum is formed after.
    """

    def _hvdc_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        backward_passes_per_step: int,
        algorithm: OneBitAlgorithm,
    ) -> None:
        """Run ``algorithm`` (built with its options, no segments yet) on this optimizer's parameters."""
        params = [p for g in self.param_groups for p in g["params"]]
        check_named_parameters(params, named_parameters)
        segments, self._hvdc_grads = _segments(self.param_groups, fresh=algorithm.has_fresh_variance)
        self._hvdc_meter = CommMeter()
        algorithm.segments, algorithm.meter = segments, self._hvdc_meter
        self._hvdc_alg = algorithm
        self._hvdc_alg.t = self._hvdc_plain_step(super(self.__class__, self).state_dict())
        self._hvdc_bind_state()
        trainable = [p for s in segments for p in s.params]
        self._hvdc_passes = PassCounter(trainable, backward_passes_per_step)
        hook_gradients(trainable, self._hvdc_count_pass)

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        self._hvdc_passes.add(p)
        self._hvdc_synchronized = False

    def _hvdc_bind_state(self) -> None:
        """Make every parameter's state tensors views of the segment buffers, keeping their values."""
        for seg in self._hvdc_alg.segments:
            keys = [("exp_avg", seg.exp_avg), ("exp_avg_sq", seg.exp_avg_sq)]
            if seg.fresh is not None:
                keys.append(("exp_avg_sq_fresh", seg.fresh))
            for key, flat in keys:
                for p, view in zip(seg.params, seg.views(flat), strict=True):
                    old = self.state[p].get(key)
                    if old is not None and old.data_ptr() != view.data_ptr():
                        view.copy_(old)
                    self.state[p][key] = view
            for p in seg.params:
                self.state[p]["step"] = torch.tensor(float(self._hvdc_alg.t), dtype=torch.float32)

    @property
    def freeze_step(self) -> int:
        return self._hvdc_alg.freeze_step

    @property
    def compression_started(self) -> bool:
        """True once the steps use the 1-bit compressed allreduce (after ``freeze_step`` steps)."""
        return self._hvdc_alg.compression_started

    @torch.no_grad()
    def synchronize(self) -> None:
        """End the gradient phase: warm-up averages the gradients densely, compression gathers them."""
        ensure_init()
        for fused in self._hvdc_grads:
            fused.gather()
        self._hvdc_alg.synchronize()
        self._hvdc_passes.reset()
        self._hvdc_mark_synchronized()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._hvdc_synchronize_for_step()
        t = self._hvdc_alg.step(self.param_groups)
        for seg in self._hvdc_alg.segments:
            for p in seg.params:
                self.state[p]["step"].fill_(float(t))
        self._hvdc_step_done()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers in place (gradients stay views, never None); the count of
        backward passes starts again (also after a step that raised)."""
        del set_to_none  # views must survive for the fused reduction
        for fused in self._hvdc_grads:
            fused.zero_()
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
        """Restore a ``state_dict()``. One without the compression section (a plain torch checkpoint) is
        accepted with the error feedback starting from zero (for 1-bit LAMB only while in warm-up)."""
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
        t = int(max(steps)) if steps else 0
        self._hvdc_alg.check_plain_step(t, STATE_KEY)
        return t


def check_adam(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Adam):
        raise TypeError(f"op=OneBitAdam wraps torch.optim.Adam or AdamW, got {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize"):
            if group.get(flag):
                raise ValueError(f"op=OneBitAdam does not support {flag}=True")


def check_lamb(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, Lamb):
        raise TypeError(f"op=OneBitLamb wraps hc.Lamb, got {type(optimizer).__name__}")
