"""What every algorithm's torch wrapper (1-bit Adam/LAMB, SLAMB, Birder) does alike: count backward passes,
gather the fused gradients, step the algorithm, zero the fused buffers, meter bytes, and carry the algorithm's
section of ``state_dict()``. Each wrapper adds its setup and, through the hooks below, what differs.
"""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress.ops.errors import UsageError
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.wrapping import STATE_KEY, SynchronizeProtocol, any_rank_nonfinite


class AlgorithmMixin(SynchronizeProtocol):
    """Methods shared by the wrappers; a subclass's ``_hvdc_setup`` sets ``_hvdc_alg`` (the algorithm),
    ``_hvdc_grads`` (its list of ``FusedGradients``), ``_hvdc_passes`` and ``_hvdc_meter``."""

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        self._hvdc_passes.add(p)
        self._hvdc_synchronized = False  # a new gradient after synchronize() starts another gradient phase

    def _hvdc_end_gradient_phase(self) -> None:
        """What ``synchronize()`` does after gathering the gradients (1-bit warm-up: the dense average)."""

    def _hvdc_after_step(self, t: int) -> None:
        """Bookkeeping of the wrapped optimizer's state after step ``t``."""

    def _hvdc_bind_state(self) -> None:
        """Make the wrapped optimizer's per-parameter state views of the algorithm's buffers."""

    @torch.no_grad()
    def synchronize(self) -> None:
        """End the gradient phase: gather this rank's gradients into the fused buffers (and what the subclass
        adds; see its class docstring). Where the algorithm has already consumed the gradients as they were
        (with overlap, a compressed stage), an edit of ``.grad`` before ``step()`` (Horovod's clipping pattern)
        is honoured: ``step()`` drops this phase's reductions, state restored, and reduces the edited gradients
        (a second exchange in that step; ``overlap=False`` clips at the cost of one)."""
        self._hvdc_gradient_phase()
        self._hvdc_remember_gradients()

    def _hvdc_gradient_phase(self) -> None:
        ensure_init()
        for fused in self._hvdc_grads:
            fused.gather()
        self._hvdc_end_gradient_phase()
        self._hvdc_passes.reset()
        self._hvdc_mark_synchronized()

    def _hvdc_consumed_gradients(self) -> list[torch.Tensor | None]:
        if not self._hvdc_alg.consumes_gradients_in_synchronize():
            return []
        for fused in self._hvdc_grads:
            fused.gather()  # a ``.grad`` the user replaced instead of editing it in place
        return [b for fused in self._hvdc_grads for b in fused.buffers]

    #: ``scaler.step(opt)`` of a ``torch.amp.GradScaler`` hands the scaler to ``step()`` (``grad_scaler=``).
    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        """The step, on every rank alike. Gradients edited after the algorithm consumed them (clipping after
        ``synchronize()``) are reduced anew. With ``scaler.step(opt)`` the gradients are unscaled here, and the
        step is skipped on every rank if any rank's held inf/NaN (the verdict written back into each scaler);
        where the algorithm had consumed them still scaled (overlap, a compressed stage), they are reduced anew
        once unscaled (pass ``overlap=False`` to reduce only once)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rejected = None
        try:
            edited = self._hvdc_synchronize_for_step()
        except UsageError as e:  # scaled gradients with inf/NaN: refused on every rank; the scaler decides below
            if grad_scaler is None:
                raise
            rejected, edited = e, True
        if grad_scaler is not None:
            edited = edited or self._hvdc_alg.consumes_gradients_in_synchronize()
            if any_rank_nonfinite(grad_scaler, self, f"{self._hvdc_alg.name}.found_inf"):
                self._hvdc_alg.abandon()
                self._hvdc_step_done()
                return loss
            if rejected is not None:
                raise rejected
        if edited:  # reduce the gradients as they are now (the abandoned reductions' state restored)
            self._hvdc_alg.abandon()
        self._hvdc_after_step(self._hvdc_alg.step(self.param_groups))
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

    def _hvdc_fill_step(self, params: list[torch.Tensor], t: int) -> None:
        for p in params:
            self.state[p]["step"].fill_(float(t))

    def state_dict(self) -> dict[str, Any]:
        out = super(self.__class__, self).state_dict()
        out[STATE_KEY] = self._hvdc_alg.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``. One without the algorithm's section (a plain torch checkpoint of the
        wrapped optimizer) starts the algorithm's own state afresh at that checkpoint's step, where the
        algorithm allows it; a checkpoint of another algorithm, world size or model raises ValueError with
        nothing changed."""
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
        """The step of a plain checkpoint (the largest per-parameter ``step``), if the algorithm can start there."""
        steps = [float(s["step"]) for s in state_dict.get("state", {}).values() if "step" in s]
        t = int(max(steps)) if steps else 0
        check = getattr(self._hvdc_alg, "check_plain_step", None)
        if check is not None:
            check(t, STATE_KEY)
        return t
