"""``hc.DistributedOptimizer(op=hc.OneBitAdam | hc.OneBitLamb)``: error-compensated 1-bit momentum.

1-bit Adam, paper 003 Algorithm 1 (wraps ``torch.optim.Adam``/``AdamW``):

- warm-up, steps 1..``freeze_step`` (line 2): the gradients are averaged densely and the wrapped
  optimizer's own rule runs (Adam's bias correction; L2 weight decay for Adam, decoupled for AdamW);
- compression, later steps (lines 5-13): the variance stays v_{freeze_step}; each rank forms
  m_r = b1 m + (1 - b1) g_r from the shared momentum and its own gradient (line 6), the momenta go
  through the error-compensated 1-bit compressed allreduce (lines 7-11, ``compressed_allreduce``),
  and every rank applies the same update with the result (line 13), with eps and bias correction as
  in warm-up (v corrected for ``freeze_step``).

1-bit LAMB, paper 001 Algorithm 1 (wraps ``hc.Lamb``), per layer (= parameter tensor):

- warm-up (line 2): dense LAMB; c_avg = coeff_beta c_avg + (1 - coeff_beta) c, c the trust ratio;
- at the end of ``freeze_step`` (line 3): v is frozen, a fresh copy keeps updating, c_avg stops;
- compression (lines 6-21): the fused momentum goes through the compressed allreduce (lines 7-13);
  g_rec = (m - b1 m_prev) / (1 - b1) (line 15); v_fresh = b2 v_fresh + (1 - b2) g_rec^2 (line 16);
  r = max over the layer of (sqrt(vh) + eps) / (sqrt(vh_fresh) + eps) (line 17, garbled in the text:
  DeepSpeed's form; vh, vh_fresh bias-corrected for freeze_step and t when the group has
  ``bias_correction``); r clipped to (1 -/+ factor_threshold) r_prev (line 18), then to
  [factor_min, factor_max] (line 19); x = x - lr r c_avg (mh / (sqrt(vh) + eps) + wd x) (lines 20-21).

Variance floor, option ``variance_floor`` (both optimizers; deviates from 003 line 13 and 001 lines 17
and 21): in the compressed stage each layer's frozen vh is used as max(vh, variance_floor * mean(vh)),
the mean over that layer (parameter tensor) of the frozen vh; 1-bit LAMB floors its fresh vh by the
same per-layer value in the ratio of line 17, so that the ratio still compares two estimates of one
second moment. ``variance_floor=0`` is the papers' exact rule; the default is 0.01. Why: the compressor
gives every element of a chunk +/-the chunk's scale, so an element whose frozen v is 0 (a ReLU unit
dead through warm-up) gets m = +/-scale and an update lr scale / eps: with eps 1e-8 parameters jump
from 0.07 to 25 in one step, then turn non-finite (DeepSpeed's OnebitAdam/OnebitLamb share this). A
unit that revives later, with v still 0, does the same. With the floor such an element is
preconditioned like a quiet element of its layer. Compressing m / (sqrt(vh) + eps) instead of m
bounds the dead elements' step but not a revived one's (it still diverged on a ReLU MLP and CNN) and
trained worse with the floor added (tests/test_relu_fidelity.py's module docstring has the figures).
The floor is derived from the frozen v in the state, so checkpoints need nothing more.

Layout: for each (param group, dtype) one *segment*: flat gradient, momentum and variance buffers of
which every parameter's ``.grad`` and ``state['exp_avg']``/``['exp_avg_sq']`` are views, so one
collective call per segment and step moves all of them. The 1-bit error feedback (``OneBitState``),
the step counter and LAMB's coefficients live in ``state_dict()['hvd_compress']``: a run resumed from
a checkpoint continues bit for bit.

Non-finite values: a NaN/Inf gradient on any rank makes ``step()`` raise ``UsageError`` on every rank
before any state changes (warm-up: checked on the averaged gradient, which every rank holds; compression:
the core checks what enters the compressor on every rank and agrees on the verdict). Nothing is skipped
silently; a caller that wants to skip such steps catches the error (the step is then not taken anywhere).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import UsageError
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce_
from hvd_compress.torch.fused import FusedGradients, flat_with_views, views_into
from hvd_compress.torch.lamb import Lamb, trust_ratio
from hvd_compress.torch.onebit import OneBitState, compressed_allreduce_
from hvd_compress.torch.wrapping import CommMeter, PassCounter, check_named_parameters

STATE_KEY = "hvd_compress"


@dataclasses.dataclass
class _Segment:
    """The parameters of one (param group, dtype) and their fused buffers."""

    group: int
    params: list[torch.nn.Parameter]
    grads: FusedGradients
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    fresh: torch.Tensor | None  # 1-bit LAMB's fresh variance
    frozen_denom: torch.Tensor | None  # 1-bit LAMB: sqrt(vh_frozen) + eps, float32, made at the first compressed step
    # float32 scratch whatever the parameter dtype: the local momentum m_r is formed and compressed in
    # float32, so a half-precision momentum loses no bits before its sign is taken.
    work: torch.Tensor  # m_r, the compressed average, then the update direction
    scratch: torch.Tensor  # denominators, the L2 gradient, the reconstructed gradient
    onebit: OneBitState
    denom_key: tuple[float, ...] | None  # the (eps, b2, freeze_step) that the kept frozen denominator d is for
    lamb_coeff_freeze: list[float]
    last_factor: list[float]
    view_cache: dict[int, list[torch.Tensor]] = dataclasses.field(default_factory=dict)
    floor_roots: list[float] = dataclasses.field(default_factory=list)  # per layer sqrt(floor), with the kept d

    @property
    def grad(self) -> torch.Tensor:
        return self.grads.buffers[0]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-parameter views of one of this segment's flat buffers (made once per buffer: the buffers
        live as long as the segment, and the views are needed several times every step)."""
        key = flat.data_ptr()
        if key not in self.view_cache:
            self.view_cache[key] = views_into(flat, self.params)
        return self.view_cache[key]


def _segments(param_groups: list[dict[str, Any]], lamb: bool) -> list[_Segment]:
    segments = []
    for gi, group in enumerate(param_groups):
        by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in group["params"]:
            if p.requires_grad:
                by_dtype.setdefault((p.dtype, p.device), []).append(p)
        for (dtype, _), params in by_dtype.items():
            if dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"1-bit optimizers support float32, float16 and bfloat16 parameters, not {dtype}")
            numel = sum(p.numel() for p in params)
            exp_avg, _ = flat_with_views(params)
            exp_avg_sq, _ = flat_with_views(params)
            segments.append(
                _Segment(
                    group=gi,
                    params=params,
                    grads=FusedGradients(params),
                    exp_avg=exp_avg,
                    exp_avg_sq=exp_avg_sq,
                    fresh=flat_with_views(params)[0] if lamb else None,
                    frozen_denom=None,
                    work=torch.empty(numel, dtype=torch.float32, device=exp_avg.device),
                    scratch=torch.empty(numel, dtype=torch.float32, device=exp_avg.device),
                    onebit=OneBitState(numel, torch.float32),
                    denom_key=None,
                    lamb_coeff_freeze=[0.0] * len(params),
                    last_factor=[1.0] * len(params),
                )
            )
    return segments


class _OneBitMixin:
    """What both 1-bit optimizers share: fused state, the two stages, checkpoints, metering."""

    _hvdc_algorithm = "OneBit"

    def _hvdc_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        backward_passes_per_step: int,
        freeze_step: int,
        **options: float,
    ) -> None:
        if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 1:
            raise ValueError(f"{self._hvdc_algorithm}: freeze_step must be an int >= 1, got {freeze_step!r}")
        params = [p for g in self.param_groups for p in g["params"]]
        check_named_parameters(params, named_parameters)
        self._hvdc_freeze_step = freeze_step
        self._hvdc_options = options
        self._hvdc_segments = _segments(self.param_groups, lamb=self._hvdc_algorithm == "OneBitLamb")
        self._hvdc_t = self._hvdc_plain_step(super(self.__class__, self).state_dict())
        self._hvdc_bind_state()
        trainable = [p for s in self._hvdc_segments for p in s.params]
        self._hvdc_passes = PassCounter(trainable, backward_passes_per_step)
        self._hvdc_meter = CommMeter()
        self._hvdc_hooks = [p.register_post_accumulate_grad_hook(self._hvdc_count_pass) for p in trainable]

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        self._hvdc_passes.add(p)

    def _hvdc_bind_state(self) -> None:
        """Make every parameter's state tensors views of the segment buffers, keeping their values."""
        for seg in self._hvdc_segments:
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
                self.state[p]["step"] = torch.tensor(float(self._hvdc_t), dtype=torch.float32)

    @property
    def freeze_step(self) -> int:
        return self._hvdc_freeze_step

    @property
    def compression_started(self) -> bool:
        """True once the steps use the 1-bit compressed allreduce (after ``freeze_step`` steps)."""
        return self._hvdc_t >= self._hvdc_freeze_step

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ensure_init()
        t = self._hvdc_t + 1
        for seg in self._hvdc_segments:
            seg.grads.gather()
        if t <= self._hvdc_freeze_step:
            for i, seg in enumerate(self._hvdc_segments):
                self._hvdc_meter.run(allreduce_, seg.grad, op=ReduceOp.Average, name=f"{self._hvdc_algorithm}.grad.{i}")
            self._hvdc_check_finite()
            for seg in self._hvdc_segments:
                self._hvdc_warmup(seg, self.param_groups[seg.group], t)
        else:
            for seg in self._hvdc_segments:
                self._hvdc_local_momentum(seg, self.param_groups[seg.group])
            if len(self._hvdc_segments) > 1:
                self._hvdc_agree_finite()
            for i, seg in enumerate(self._hvdc_segments):
                self._hvdc_meter.run(compressed_allreduce_, seg.work, seg.onebit, name=f"{self._hvdc_algorithm}.m.{i}")
            for seg in self._hvdc_segments:
                self._hvdc_compressed(seg, self.param_groups[seg.group], t)
        self._hvdc_t = t
        for seg in self._hvdc_segments:
            for p in seg.params:
                self.state[p]["step"].fill_(float(t))
        self._hvdc_passes.reset()
        return loss

    def _hvdc_check_finite(self) -> None:
        # Every rank holds the same averaged gradients, so every rank reaches the same verdict.
        for seg in self._hvdc_segments:
            if not bool(torch.isfinite(seg.grad).all()):
                bad = int((~torch.isfinite(seg.grad)).nonzero()[0, 0])
                raise UsageError(
                    f"{self._hvdc_algorithm}: non-finite averaged gradient at step {self._hvdc_t + 1} (element "
                    f"{bad} of param group {seg.group}: value {float(seg.grad[bad])}); step not taken, state unchanged"
                )

    def _hvdc_agree_finite(self) -> None:
        # With several segments the core's per-call check could reject a later one after an earlier one
        # updated its error feedback; one tiny allreduce first keeps a rejected step free of side effects.
        local = sum(int((~torch.isfinite(seg.work)).any()) for seg in self._hvdc_segments)
        flag = torch.tensor([float(local)])
        self._hvdc_meter.run(allreduce_, flag, op=ReduceOp.Sum, name=f"{self._hvdc_algorithm}.finite")
        if float(flag) > 0:
            raise UsageError(
                f"{self._hvdc_algorithm}: non-finite local momentum at step {self._hvdc_t + 1} on "
                f"{int(float(flag))} segment(s) over all ranks (NaN/Inf gradient); step not taken, state unchanged"
            )

    def _hvdc_local_momentum(self, seg: _Segment, group: dict[str, Any]) -> None:
        """work = b1 m + (1 - b1) g_r (003 Alg. 1 line 6; 001 Alg. 1 line 6), this rank's gradient."""
        b1 = group["betas"][0]
        # Copy first: torch.mul(half, scalar, out=float32) would round the product to the half dtype.
        seg.work.copy_(seg.grad).mul_(1 - b1)
        self._hvdc_add_l2(seg.work, seg, group, (1 - b1) * group["weight_decay"])
        seg.work.add_(seg.exp_avg, alpha=b1)

    def _hvdc_add_l2(self, flat: torch.Tensor, seg: _Segment, group: dict[str, Any], alpha: float) -> None:
        """Adds alpha * x to ``flat`` where the rule has an L2 term in the gradient (Adam's weight decay)."""

    def _hvdc_frozen_denom(self, seg: _Segment, group: dict[str, Any], f: int) -> torch.Tensor:
        """d = max(sqrt(vh_frozen), sqrt(floor)) + eps per layer (see the top: variance floor): v does not
        change after freeze_step, so d is computed once (per eps, b2) into ``_hvdc_denom_buffer(seg)``."""
        b2 = group["betas"][1]
        key = (float(group["eps"]), float(b2), float(f))
        out = self._hvdc_denom_buffer(seg)
        if seg.denom_key != key:
            bc = 1 - b2**f if group.get("bias_correction", True) else 1.0
            torch.sqrt(seg.exp_avg_sq, out=out)
            if bc != 1.0:
                out.div_(math.sqrt(bc))
            ratio = self._hvdc_options["variance_floor"]
            seg.floor_roots = [math.sqrt(ratio * float(v.double().mean()) / bc) if v.numel() else 0.0
                               for v in seg.views(seg.exp_avg_sq)]
            self._hvdc_floor(seg, out)
            out.add_(group["eps"])
            seg.denom_key = key
        return out

    def _hvdc_floor(self, seg: _Segment, root: torch.Tensor) -> None:
        """root = max(root, sqrt(floor)) per layer, with the floors of the kept frozen denominator."""
        if self._hvdc_options["variance_floor"] > 0:
            for view, floor in zip(seg.views(root), seg.floor_roots, strict=True):
                view.clamp_min_(floor)

    def _hvdc_denom_buffer(self, seg: _Segment) -> torch.Tensor:
        """Where d is kept during the compressed stage."""
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers in place (gradients stay views, never None); the count of
        backward passes starts again (also after a step that raised)."""
        del set_to_none  # views must survive for the fused reduction
        for seg in self._hvdc_segments:
            seg.grads.zero_()
        self._hvdc_passes.reset()

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self._hvdc_meter.take()

    def state_dict(self) -> dict[str, Any]:
        out = super(self.__class__, self).state_dict()
        out[STATE_KEY] = {
            "algorithm": self._hvdc_algorithm,
            "step": self._hvdc_t,
            "freeze_step": self._hvdc_freeze_step,
            "segments": [
                {
                    "numel": seg.exp_avg.numel(),
                    "onebit": seg.onebit.state_dict(),
                    "lamb_coeff_freeze": list(seg.lamb_coeff_freeze),
                    "last_factor": list(seg.last_factor),
                }
                for seg in self._hvdc_segments
            ],
        }
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()``. One without the compression section (a plain torch checkpoint) is
        accepted with the error feedback starting from zero (for 1-bit LAMB only while in warm-up)."""
        state_dict = dict(state_dict)
        ours = state_dict.pop(STATE_KEY, None)
        if not hasattr(self, "_hvdc_segments"):  # rewrap() loading the wrapped optimizer's state
            return super(self.__class__, self).load_state_dict(state_dict)
        if ours is not None:
            self._hvdc_check_section(ours)
        else:
            t = self._hvdc_plain_step(state_dict)
        super(self.__class__, self).load_state_dict(state_dict)
        if ours is None:
            for seg in self._hvdc_segments:
                seg.onebit.reset()
            self._hvdc_t = t
        else:
            self._hvdc_t = int(ours["step"])
            for seg, saved in zip(self._hvdc_segments, ours["segments"], strict=True):
                seg.onebit.load_state_dict(saved["onebit"])
                seg.lamb_coeff_freeze = [float(c) for c in saved["lamb_coeff_freeze"]]
                seg.last_factor = [float(c) for c in saved["last_factor"]]
        for seg in self._hvdc_segments:
            seg.denom_key = None
        self._hvdc_bind_state()

    def _hvdc_plain_step(self, state_dict: dict[str, Any]) -> int:
        """The step of a checkpoint without our section (a plain torch optimizer's); refused where the
        missing state matters: 1-bit LAMB past its warm-up (its averaged trust ratios are lost)."""
        steps = [float(s["step"]) for s in state_dict.get("state", {}).values() if "step" in s]
        t = int(max(steps)) if steps else 0
        if t > self._hvdc_freeze_step and self._hvdc_algorithm == "OneBitLamb":
            raise ValueError(
                f"{self._hvdc_algorithm}: the optimizer state (step {t}) has no '{STATE_KEY}' section, "
                f"which is needed after freeze_step={self._hvdc_freeze_step}"
            )
        return t

    def _hvdc_check_section(self, ours: dict[str, Any]) -> None:
        what = f"{self._hvdc_algorithm}.load_state_dict"
        if ours.get("algorithm") != self._hvdc_algorithm:
            raise ValueError(f"{what}: the checkpoint is for {ours.get('algorithm')!r}")
        if ours.get("freeze_step") != self._hvdc_freeze_step:
            raise ValueError(f"{what}: checkpoint freeze_step {ours.get('freeze_step')} != {self._hvdc_freeze_step}")
        saved = ours.get("segments", [])
        want = [seg.exp_avg.numel() for seg in self._hvdc_segments]
        if [s.get("numel") for s in saved] != want:
            raise ValueError(f"{what}: fused buffer sizes {[s.get('numel') for s in saved]} != this model's {want}")
        for seg, s in zip(self._hvdc_segments, saved, strict=True):
            if len(s["lamb_coeff_freeze"]) != len(seg.params) or len(s["last_factor"]) != len(seg.params):
                raise ValueError(f"{what}: per-layer coefficients do not match the parameters")
            probe = OneBitState(seg.onebit.numel, seg.onebit.dtype, seg.onebit.world_size)
            probe.load_state_dict(s["onebit"])  # raises a clear ValueError before anything changes


class OneBitAdamMixin(_OneBitMixin):
    """1-bit Adam over a wrapped ``torch.optim.Adam``/``AdamW`` (paper 003, Algorithm 1)."""

    _hvdc_algorithm = "OneBitAdam"

    @staticmethod
    def _hvdc_decoupled(group: dict[str, Any]) -> bool:
        return bool(group.get("decoupled_weight_decay", False))

    def _hvdc_add_l2(self, flat: torch.Tensor, seg: _Segment, group: dict[str, Any], alpha: float) -> None:
        if alpha != 0 and not self._hvdc_decoupled(group):
            torch._foreach_add_(seg.views(flat), seg.params, alpha=alpha)

    def _hvdc_warmup(self, seg: _Segment, group: dict[str, Any], t: int) -> None:
        """Adam's step on the averaged gradient (003 Alg. 1 line 2), with Adam's L2 term g + wd x."""
        b1, b2 = group["betas"]
        g = seg.grad
        if group["weight_decay"] != 0 and not self._hvdc_decoupled(group):
            g = seg.scratch.copy_(seg.grad)
            self._hvdc_add_l2(g, seg, group, group["weight_decay"])
        seg.exp_avg.mul_(b1).add_(g, alpha=1 - b1)
        seg.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        self._hvdc_apply(seg, group, t, t)

    def _hvdc_compressed(self, seg: _Segment, group: dict[str, Any], t: int) -> None:
        """m = the compressed average (in ``work``); v frozen (003 Alg. 1 line 13)."""
        seg.exp_avg.copy_(seg.work)
        self._hvdc_apply(seg, group, t, self._hvdc_freeze_step)

    def _hvdc_denom_buffer(self, seg: _Segment) -> torch.Tensor:
        return seg.scratch  # free in the compressed stage: the L2 gradient copy is a warm-up thing

    def _hvdc_apply(self, seg: _Segment, group: dict[str, Any], t_m: int, t_v: int) -> None:
        """x = x - lr / (1 - b1^t_m) * m / (sqrt(v) / sqrt(1 - b2^t_v) + eps), as torch.optim.Adam."""
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        params = seg.params
        if wd != 0 and self._hvdc_decoupled(group):
            torch._foreach_mul_(params, 1 - lr * wd)
        if t_v < t_m:  # v frozen: the denominator is the same every step, computed once and kept
            denom = self._hvdc_frozen_denom(seg, group, t_v)
        else:
            denom = torch.sqrt(seg.exp_avg_sq, out=seg.scratch).div_(math.sqrt(1 - b2**t_v)).add_(group["eps"])
            seg.denom_key = None
        torch._foreach_addcdiv_(params, seg.views(seg.exp_avg), seg.views(denom), value=-lr / (1 - b1**t_m))


class OneBitLambMixin(_OneBitMixin):
    """1-bit LAMB over a wrapped ``hc.Lamb`` (paper 001, Algorithm 1)."""

    _hvdc_algorithm = "OneBitLamb"

    def _hvdc_warmup(self, seg: _Segment, group: dict[str, Any], t: int) -> None:
        """LAMB on the averaged gradient, averaging the trust ratios (001 Alg. 1 lines 2-3)."""
        b1, b2 = group["betas"]
        g = seg.grad
        seg.exp_avg.mul_(b1).add_(g, alpha=1 - b1)
        seg.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        if t == self._hvdc_freeze_step:  # line 3: the fresh variance starts from the frozen one
            seg.fresh.copy_(seg.exp_avg_sq)
        u = self._hvdc_direction(seg, group, t, t)
        beta3 = self._hvdc_options["coeff_beta"]
        x_norms = torch._foreach_norm(seg.params)
        u_norms = torch._foreach_norm(u)
        scales = []
        for i, (xn, un) in enumerate(zip(x_norms, u_norms, strict=True)):
            c = float(trust_ratio(xn, un, group["min_coeff"], group["max_coeff"]))
            seg.lamb_coeff_freeze[i] = beta3 * seg.lamb_coeff_freeze[i] + (1 - beta3) * c
            scales.append(-group["lr"] * c)
        torch._foreach_mul_(u, scales)
        torch._foreach_add_(seg.params, u)

    def _hvdc_compressed(self, seg: _Segment, group: dict[str, Any], t: int) -> None:
        """Lines 14-21: reconstructed gradient, fresh variance, clipped ratio, update with frozen v."""
        b1, b2 = group["betas"]
        opt = self._hvdc_options
        f = self._hvdc_freeze_step
        g_rec = torch.sub(seg.work, seg.exp_avg, alpha=b1, out=seg.scratch).div_(1 - b1)
        seg.fresh.mul_(b2).addcmul_(g_rec, g_rec, value=1 - b2)
        seg.exp_avg.copy_(seg.work)
        frozen = self._hvdc_frozen_denom(seg, group, f)
        fresh = torch.sqrt(seg.fresh, out=seg.scratch)
        if group.get("bias_correction", True):
            fresh.div_(math.sqrt(1 - b2**t))
        self._hvdc_floor(seg, fresh)  # the frozen variance's floor: line 17 compares like with like
        ratio = torch.div(frozen, fresh.add_(group["eps"]), out=seg.scratch)
        scales = []
        for i, view in enumerate(seg.views(ratio)):
            r = float(view.max()) if view.numel() else 1.0
            prev = seg.last_factor[i]
            r = min(max(r, (1 - opt["factor_threshold"]) * prev), (1 + opt["factor_threshold"]) * prev)
            r = min(max(r, opt["factor_min"]), opt["factor_max"])
            seg.last_factor[i] = r
            scales.append(-group["lr"] * r * seg.lamb_coeff_freeze[i])
        u = torch.div(seg.exp_avg, frozen, out=seg.work)
        if group.get("bias_correction", True):
            u.div_(1 - b1**t)
        views = seg.views(u)
        if group["weight_decay"] != 0:
            torch._foreach_add_(views, seg.params, alpha=group["weight_decay"])
        torch._foreach_mul_(views, scales)
        torch._foreach_add_(seg.params, views)

    def _hvdc_denom_buffer(self, seg: _Segment) -> torch.Tensor:
        # Its own buffer (``scratch`` holds the reconstructed gradient and the ratio), made when first needed.
        if seg.frozen_denom is None:
            seg.frozen_denom = torch.empty(seg.exp_avg.numel(), dtype=torch.float32, device=seg.exp_avg.device)
        return seg.frozen_denom

    def _hvdc_direction(self, seg: _Segment, group: dict[str, Any], t_m: int, t_v: int) -> list[torch.Tensor]:
        """u = mh / (sqrt(vh) + eps) + wd x per layer, in ``work`` (views)."""
        b1, b2, eps = *group["betas"], group["eps"]
        u = seg.work
        if group.get("bias_correction", True):
            torch.sqrt(seg.exp_avg_sq, out=u).div_(math.sqrt(1 - b2**t_v)).add_(eps)
            u.reciprocal_().mul_(seg.exp_avg).div_(1 - b1**t_m)
        else:
            torch.sqrt(seg.exp_avg_sq, out=u).add_(eps).reciprocal_().mul_(seg.exp_avg)
        views = seg.views(u)
        if group["weight_decay"] != 0:
            torch._foreach_add_(views, seg.params, alpha=group["weight_decay"])
        return views


ADAM_OPTIONS: dict[str, Any] = {"variance_floor": 0.01}
LAMB_OPTIONS = {"coeff_beta": 0.9, "factor_min": 0.5, "factor_max": 4.0, "factor_threshold": 0.1,
                "variance_floor": 0.01}


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


def split_options(op_name: str, defaults: dict[str, Any], options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(freeze_step, the algorithm's options with defaults filled in); unknown names raise."""
    options = dict(options)
    if "freeze_step" not in options:
        raise TypeError(f"op={op_name} needs freeze_step=<number of dense warm-up steps>")
    freeze_step = options.pop("freeze_step")
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        takes = ", ".join(["freeze_step", *sorted(defaults)])
        raise TypeError(f"op={op_name} got unknown options {unknown}; it takes {takes}")
    merged = {**defaults, **options}
    floor = merged["variance_floor"]
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < math.inf:
        raise ValueError(
            f"op={op_name}: variance_floor must be a finite number >= 0 (0: the papers' exact rule; default "
            f"{defaults['variance_floor']}), got {floor!r}"
        )
    if "factor_min" in merged and not 0 < merged["factor_min"] <= merged["factor_max"]:
        raise ValueError(f"op={op_name}: need 0 < factor_min <= factor_max, got {merged}")
    if "factor_threshold" in merged and not 0 <= merged["factor_threshold"] < 1:
        raise ValueError(f"op={op_name}: factor_threshold must be in [0, 1), got {merged['factor_threshold']}")
    if "coeff_beta" in merged and not 0 <= merged["coeff_beta"] < 1:
        raise ValueError(f"op={op_name}: coeff_beta must be in [0, 1), got {merged['coeff_beta']}")
    return freeze_step, merged
