"""0/1 Adam: Lu et al., ICLR 2023 (arXiv 2202.06009), Algorithm 1, as DeepSpeed's ``zoadam.py`` instantiates it
and docs/algorithms/zero-one-adam-spec.md fixes it (lines P1-P5 and L1-L6 of its section 2, schedules S1-S3).

- phase 1, t <= var_freeze_step: on a variance step (s = t + 1 a multiple of var_interval) the gradients are
  averaged densely and v is updated (P1, P2); on the other steps the gradients go through the error-compensated
  1-bit allreduce (P1', Z5); then m = b1 m + (1 - b1) g and x -= lr m / (sqrt(v) + eps) (P3, P4). The errors are
  zeroed and x_anchor = x at the end of step var_freeze_step (P5, Z7).
- phase 2: each rank steps on its own gradient with v frozen, u += lr m, lrs += lr (L1-L3); on a sync step (s a
  multiple of local_step_interval) u goes through the 1-bit allreduce, m = ubar / lrs and
  x = x_anchor - ubar / d - wd lrs x_anchor on every rank alike (L4-L6, Z3, Z4).

Weight decay is decoupled (Z3); m is not bias-corrected (Z2), v is by default (``variance_bias_correction``, Z17:
v / (1 - b2^n_v) after n_v variance updates; False is DeepSpeed's rule). ``reset_momentum_at_sync`` (Z18, not
DeepSpeed's): m = 0 after a sync's L6 in place of L5's ubar / lrs, whose 1-bit error the next interval's local
steps would otherwise step on. Deviation,
``variance_floor`` (Z12; 0 is DeepSpeed's rule): d = max(sqrt(v), sqrt(floor)) + eps per layer with 1-bit Adam's
floor, and an element it lifted moves at most lr. The step kind depends on t and the options only, so a bucket's
collective is chosen before backward ends (overlap). Errors, u, x_anchor and lrs are per bucket; the counters are
the algorithm's. All of it is in ``state_dict()`` (nothing is reset on load: Z13). The NumPy twin is
``hvd_compress.reference.zero_one_adam``.

The learning rate (Z21). u sums lr m (L3: Algorithm 1's u_{t+1/2} = u_t + gamma_t m_{t+1/2}, as the spec restates
it), so the error feedback that L4's 1-bit exchange of u (ubar = C[u]) leaves is in the units of the lr of that
sync; the algorithm box says nothing of the carried error when gamma changes. Kept as it is, each later sync would
still send the error of the old lr: at lr 0 every sync would move x, and after a 10x drop they would step as the
old lr did. Each bucket's errors are therefore brought to the lr of the sync that sends them, as PowerSGD's error
follows a GradScaler's scale: times lr / ``error_lr`` (the lr of the sync that made them, in ``state_dict()``), and
dropped where either is 0, so at lr 0 nothing moves.

L6 starts from x_anchor, so a change made to the parameters outside the optimizer in phase 2 would be replaced at
the next sync (Z20): ``synchronize_parameters()`` ends the interval with the exact mean of the ranks' x, and a face
that sees such changes (``parameters_edited``; the torch face reads torch's version counters, the TF face keeps a
copy of what its last step left) has every rank do it at the step after one, agreed on in the step's small
allreduce.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hvd_compress import ops
from hvd_compress.algorithms import contract
from hvd_compress.algorithms.agreement import counts_everywhere
from hvd_compress.algorithms.bucketed import BucketedAlgorithm
from hvd_compress.algorithms.onebit import DEFAULT_VARIANCE_FLOOR, capped_views, floor_denoms, floor_roots
from hvd_compress.ops import onebit_adam_kernels as fused_ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.errors import MismatchError, UsageError
from hvd_compress.ops.onebit import compressed_allreduce_
from hvd_compress.ops.traffic import CommMeter

#: Step kinds (spec section 3): dense variance step, 1-bit gradient step, local step, 1-bit sync of u.
VARIANCE, ONEBIT, LOCAL, SYNC = "variance", "onebit", "local", "sync"
#: Steps this many times a bias-corrected Adam's, or more, after the freeze are warned of: above DeepSpeed's BERT
#: recipe, below the longest freeze measured to diverge (spec Z19 gives both).
STEP_INFLATION_WARNED = 4.0


def errors_to_lr(xp: Backend, errors: Any, error_lr: float, lr: float) -> None:
    """Spec Z21: bring the worker and server error of phase 2, made by a sync at ``error_lr``, to the units of a
    sync at ``lr`` before its exchange of u (L4): times lr / error_lr, rounded to float32 as the errors are; dropped
    where either lr is 0 (an error of lr 0 moves nothing, nor does any error at lr 0). The reference's
    ``errors_to_lr`` is the same rule. A NaN ``error_lr`` (a checkpoint that did not record it) keeps the errors as
    they are, in the units of this sync's lr: dropping them would lose what the checkpoint holds."""
    if lr == error_lr > 0 or math.isnan(error_lr):
        return
    if lr > 0 and error_lr > 0:
        factor = float(np.float32(lr / error_lr))
        xp.mul_(errors.worker_error, factor)
        xp.mul_(errors.server_error, factor)
    else:
        errors.reset()


def variance_correction(b2: float, var_updates: int) -> float:
    """1 - b2^n_v: the bias correction of v after n_v variance updates (spec Z17)."""
    return 1 - b2 ** var_updates


def step_inflation(b2: float, var_updates: int) -> float:
    """1 / sqrt(1 - b2^n_v): how many times a bias-corrected Adam's step each step is once v is frozen uncorrected
    after n_v variance updates (spec Z2, Z17)."""
    left = variance_correction(b2, var_updates)
    return math.inf if left <= 0.0 else 1.0 / math.sqrt(left)


@dataclasses.dataclass(frozen=True)
class ZeroOneAdamOptions:
    """DeepSpeed's names and defaults (spec section 5; ``local_step_scaler`` keeps its 32678: Z9), but for two guards:
    ``variance_floor`` (Z12) and ``variance_bias_correction``. True (the default) divides v by 1 - b2^n_v wherever d
    is formed (Z17), the rule that trains; False is DeepSpeed's (Z2), whose uncorrected v, frozen after a short
    var_freeze_step, makes every later step 1 / sqrt(1 - b2^n_v) times a corrected Adam's and diverges on a ReLU
    MLP (docs/algorithms/zero-one-adam.md, "A short var_freeze_step diverges"). ``reset_momentum_at_sync``: Z18."""

    var_freeze_step: int = 100000
    var_update_scaler: int = 16
    local_step_scaler: int = 32678
    local_step_clipper: int = 16
    variance_floor: float = DEFAULT_VARIANCE_FLOOR
    variance_bias_correction: bool = True
    reset_momentum_at_sync: bool = False

    def validate(self, op_name: str) -> None:
        for name in ("variance_bias_correction", "reset_momentum_at_sync"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"op={op_name}: {name} must be True or False, got {getattr(self, name)!r}")
        floor = self.variance_floor
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < math.inf:
            raise ValueError(f"op={op_name}: variance_floor must be a finite number >= 0 (0: DeepSpeed's rule; "
                             f"default {DEFAULT_VARIANCE_FLOOR}), got {floor!r}")
        for name, least in (("var_freeze_step", 0), ("var_update_scaler", 1), ("local_step_scaler", 1),
                            ("local_step_clipper", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"op={op_name}: {name} must be an int >= {least}, got {value!r}")


def check_hyperparameters(op_name: str, group: dict[str, Any]) -> None:
    """ValueError for a param group's values the rule cannot take (read every step: schedulers may change them). The
    decay is decoupled (Z3): a group whose optimizer adds it to the gradient instead (torch's Adam) is refused."""
    if group["weight_decay"] and not group.get("decoupled_weight_decay", True):
        raise ValueError(f"op={op_name} decays weights decoupled (as AdamW; 0/1 Adam spec Z3): wrap "
                         "torch.optim.AdamW, or Adam with weight_decay=0")
    b1, b2 = group["betas"]
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"op={op_name}: betas must lie in [0, 1), got {group['betas']}")
    if not group["lr"] >= 0 or not group["eps"] > 0 or not group["weight_decay"] >= 0:
        raise ValueError(f"op={op_name}: need lr >= 0, eps > 0, weight_decay >= 0; got lr {group['lr']}, eps "
                         f"{group['eps']}, weight_decay {group['weight_decay']}")


@dataclasses.dataclass
class ZeroOneBucket:
    """The float32 parameters of one bucket (of one param group) with the face's flat buffers.

    ``grad`` (each ``.grad`` a view), ``exp_avg`` (m) and ``exp_avg_sq`` (v, views of the wrapped optimizer's state);
    ``u`` and ``anchor`` (x_anchor); ``work`` (the collective's buffer), ``scratch`` and ``denom`` (d while v is
    frozen); ``onebit``: the error feedback (``OneBitState``); ``lrs``: the sum of lr since the last sync;
    ``error_lr``: the lr of the sync that left the phase-2 errors, the units they are in (Z21; 0: none to keep)."""

    group: int
    params: list[Tensor]
    sizes: list[int]
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    u: Tensor
    anchor: Tensor
    work: Tensor
    scratch: Tensor
    denom: Tensor
    onebit: Any
    views: Callable[[Tensor], list[Tensor]]
    lrs: float = 0.0
    error_lr: float = 0.0
    denom_key: tuple[float, float] | None = None  # the (eps, bc2) ``denom`` holds d for (None: to compute)
    floor_denoms: list[float] | None = None  # per layer the d of an element the variance floor lifted (None: no floor)

    @property
    def numel(self) -> int:
        return sum(self.sizes)


class ZeroOneAdam(BucketedAlgorithm):
    """0/1 Adam over the face's buckets; lr, betas, eps and weight_decay read from the groups every step.
    The buckets' pipeline, backups and layout check are ``BucketedAlgorithm``'s."""

    name = "ZeroOneAdam"
    options_cls = ZeroOneAdamOptions
    op = AlgorithmOp("ZeroOneAdam", 21)
    buffers = "zeroone"
    wraps = contract.ADAM

    def __init__(self, options: ZeroOneAdamOptions, backend: Backend, buckets: Sequence[ZeroOneBucket],
                 meter: CommMeter | None) -> None:
        super().__init__(options, backend, buckets, meter)
        self.var_interval, self.var_counter = 1, 0
        self.local_step_interval, self.local_step_counter = 1, 0
        self.var_updates = 0  # n_v: the variance updates so far (v's bias correction, Z17)
        self._probe: ZeroOneAdam | None = None  # a schedule replayed up to some step (``restore_schedule``)
        self._inflation_checked = False  # Z19: once per process, at the freeze or where a resumed run takes over
        #: Z20: a face that sees changes made to the parameters outside the optimizer sets ``detects_edits``, and
        #: before each step ``parameters_edited`` (this rank's parameters changed since its last step).
        self.detects_edits = False
        self.parameters_edited = False
        self._edit_warned = False

    # -- the schedules (spec S1-S3; zoadam.py l.268-292) -----------------------------------------------
    def step_kind(self) -> str:
        """What step t = self.t + 1 does; DeepSpeed's counter is s = t + 1 (Z1)."""
        t = self.t + 1
        if t <= self.options.var_freeze_step:
            return VARIANCE if (t + 1) % self.var_interval == 0 else ONEBIT
        return SYNC if (t + 1) % self.local_step_interval == 0 else LOCAL

    def _advance(self, t: int, kind: str) -> None:
        """The counters after step ``t`` of ``kind``."""
        if t <= self.options.var_freeze_step:
            if kind == VARIANCE:
                self.var_updates += 1
                self.var_counter += 1
                if self.var_counter == self.options.var_update_scaler:
                    self.var_counter, self.var_interval = 0, self.var_interval * 2
        else:
            self.local_step_counter += 1
            if self.local_step_counter == self.options.local_step_scaler:
                self.local_step_counter = 0
                self.local_step_interval = min(self.options.local_step_clipper, self.local_step_interval * 2)

    def _replay(self, t: int) -> None:
        """The counters of a run at step ``t`` (they follow from t and the options)."""
        self.var_interval, self.var_counter, self.local_step_interval, self.local_step_counter = 1, 0, 1, 0
        self.t, self.var_updates = 0, 0
        while self.t < t:
            self._advance(self.t + 1, self.step_kind())
            self.t += 1

    def restore_schedule(self, t: int, counters: Sequence[int]) -> None:
        """Step count and the four saved counters of a checkpoint; n_v follows from t and the options (the schedule
        replayed up to the freeze once, then continued: a face that restores every step pays once)."""
        probe = self._probe
        if probe is None or probe.t > t:
            probe = copy.copy(self)
            probe._probe = None
            probe._replay(0)
        while probe.t < min(t, self.options.var_freeze_step):
            probe._advance(probe.t + 1, probe.step_kind())
            probe.t += 1
        self._probe = probe
        self.t, self.var_updates = t, probe.var_updates
        self.var_interval, self.var_counter, self.local_step_interval, self.local_step_counter = (
            int(c) for c in counters)

    # -- the buckets of a step -------------------------------------------------------------------------
    def rejection_is_the_step(self, t: int) -> bool:
        return self.step_kind() != VARIANCE  # the dense average of a NaN is refused in ``step`` (check_finite)

    def mutable_state(self, seg: ZeroOneBucket) -> tuple[Tensor, Tensor]:
        return seg.onebit.worker_error, seg.onebit.server_error

    def reduce_bucket(self, i: int, groups: Sequence[dict[str, Any]] | None, t: int) -> None:
        """Bucket ``i``'s collective for step ``t``: the dense average of the gradients (P1), the 1-bit average of
        the gradients (P1') or of u + lr m_r, this rank's u after L1 and L3 (L4), in ``work``; none on local steps."""
        kind = self.step_kind()
        if kind == LOCAL:
            return
        seg, xp = self.buckets[i], self.xp
        name = self.call_name(f"{self.name}.{kind}.{i}", i, groups)
        with failure_joins_as_rejection(self.meter, name):
            if kind == VARIANCE:
                self.meter.run(ops.allreduce_, seg.grad, op=ReduceOp.Average, name=name)
                return
            if kind == ONEBIT:
                xp.copy_(seg.work, seg.grad)
            else:
                if groups is None:
                    raise ValueError(f"{self.name}: a sync step needs the param groups")
                group = groups[seg.group]
                self._local_momentum(seg, group, seg.scratch)
                xp.add_(xp.copy_(seg.work, seg.u), seg.scratch, alpha=group["lr"])
            self.backup(i)  # a later bucket may still fail: keep a way back
            if kind == SYNC:
                errors_to_lr(self.xp, seg.onebit, seg.error_lr, group["lr"])
        self.meter.run(compressed_allreduce_, seg.work, *self.mutable_state(seg), name=name)

    def synchronize(self, groups: Sequence[dict[str, Any]] | None = None) -> None:
        """A variance step averages ``grad`` densely here (as Horovod: an edit after it acts on the average); the
        other kinds never average a gradient (with overlap the buckets started from the hooks are finished)."""
        if self.step_kind() == VARIANCE:
            if not self._done:
                self.reduce_all(groups)
        else:
            BucketedAlgorithm.synchronize(self, groups)

    def consumes_gradients_in_synchronize(self) -> bool:
        # a local step has no collective: it reads the gradients in ``step()``, edits and all
        return self.overlap and self.step_kind() in (ONEBIT, SYNC)

    def writes_gradients(self) -> bool:
        return self.overlap and self.step_kind() == VARIANCE

    # -- the step --------------------------------------------------------------------------------------
    def step(self, groups: Sequence[dict[str, Any]]) -> int:
        """One step on every bucket (reducing the buckets not reduced yet); returns the new step count. Nothing
        changes if the hyper-parameters are refused or any bucket or gradient is refused on any rank."""
        t, kind = self.t + 1, self.step_kind()
        try:
            for group in groups:
                check_hyperparameters(self.name, group)
        except ValueError:
            self.abandon()
            raise
        if kind == SYNC and self.detects_edits:  # Z20: agreed once the buckets' exchanges are done
            if not self._done:
                self.reduce_all(groups)
            if self._agree([int(self.parameters_edited)], "sync")[0]:
                self.abandon()  # the exchange of u is redone from the synchronized interval
                self._resynchronize(t)
                self.reduce_all(groups)
        self.reduce_pending(groups)
        if kind == VARIANCE:
            self._check_finite()
        elif kind == LOCAL:  # no collective to refuse a bad gradient: agree on it first (Z16), and on edits (Z20)
            local = sum(int(self.xp.any_nonfinite(seg.grad)) for seg in self.buckets)
            counts = [local, int(self.parameters_edited)] if self.detects_edits else [local]
            agreed = self._agree(counts, "local", groups)
            if agreed[0]:
                raise UsageError(f"{self.name}: non-finite gradient on some rank at step {t} (a local step); step "
                                 "not taken, state unchanged")
            if agreed[1:] and agreed[1]:
                self._resynchronize(t)
        if self.t == 0 and self.options.var_freeze_step == 0:
            self._anchor()  # all of the run is phase 2: x_anchor is the starting point
        for seg in self.buckets:
            group = groups[seg.group]
            if kind in (VARIANCE, ONEBIT):
                self._phase1(seg, group, kind)
            else:
                self._phase2(seg, group, kind)
        if t == self.options.var_freeze_step:  # P5: errors restart in u's units (Z7)
            for seg in self.buckets:
                seg.onebit.reset()
            self._anchor()
        self._advance(t, kind)
        self.t = t
        if t >= self.options.var_freeze_step > 0 and not self._inflation_checked:
            self._inflation_checked = True
            if not self.options.variance_bias_correction:
                self._warn_of_inflated_steps(groups)
        return t

    def _agree(self, counts: list[int], kind: str, groups: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """``counts`` summed over the ranks (one small allreduce; its name keeps the Z16 agreement's alone, and with
        ``groups`` their hyper-parameters: a local step has no other call to compare them)."""
        name = f"{self.name}.{kind}.finite" if kind == "local" and len(counts) == 1 else f"{self.name}.{kind}.agree"
        try:
            return counts_everywhere(self.xp, self.buckets[0].grad, counts, self.meter,
                                     self.call_name(name, None, groups))
        except MismatchError as e:
            raise self.mismatch_explained(e, groups) from e

    def _resynchronize(self, t: int) -> None:
        """Z20 at step ``t``: some rank's parameters changed outside the optimizer since its last step. Said once
        per process, on every rank alike."""
        if not self._edit_warned:
            self._edit_warned = True
            warnings.warn(
                f"op={self.name}: parameters changed outside the optimizer after step {t - 1} on some rank (loaded "
                "weights, a re-initialized, pruned or clamped layer). A sync step computes the parameters from "
                "their value at the last sync, which would drop the change, so every rank averages them densely "
                "now (spec Z20): a dense exchange of the parameters at each step after such a change", UserWarning,
                stacklevel=2)
        self.synchronize_parameters()

    def synchronize_parameters(self) -> None:
        """Spec Z20: end the local interval now: x = x_anchor = the exact mean of the ranks' x (one dense allreduce
        per bucket), u = 0, lrs = 0; m, v, the errors and the schedules stay. Before phase 2 nothing to do: every
        rank holds the same x, and x_anchor is taken at the freeze (P5). Also what to call before evaluating or
        saving one rank's model between syncs."""
        if self.t == 0 or self.t < self.options.var_freeze_step:
            return
        xp = self.xp
        for i, seg in enumerate(self.buckets):
            views = seg.views(seg.work)
            for v, p in zip(views, seg.params, strict=True):
                xp.copy_(v, p)
            self.meter.run(ops.allreduce_, seg.work, op=ReduceOp.Average, name=f"{self.name}.params.{i}")
            for v, p, a in zip(views, seg.params, seg.views(seg.anchor), strict=True):
                xp.copy_(p, v)
                xp.copy_(a, v)
            xp.zero_(seg.u)
            seg.lrs = 0.0

    def backs_up(self) -> bool:
        """On every sync step where edits are detected (a TF face's fresh copies too): its exchange may be redone
        after the parameters were synchronized (Z20), from the errors as they were."""
        return super().backs_up() or (self.detects_edits and self.step_kind() == SYNC)

    def _warn_of_inflated_steps(self, groups: Sequence[dict[str, Any]]) -> None:
        """Spec Z19: an uncorrected v frozen after few variance updates steps as an lr many times the user's and can
        diverge to finite values with no error, so say so once, on every rank alike, when v freezes, and again in a
        process that resumed past the freeze (its first step), whose user may not have the first run's log."""
        inflation = max(step_inflation(group["betas"][1], self.var_updates) for group in groups)
        if inflation >= STEP_INFLATION_WARNED:
            warnings.warn(
                f"op={self.name} froze v after {self.var_updates} variance updates without bias correction "
                f"(DeepSpeed's rule): every later step is {inflation:.1f} times a bias-corrected Adam's, which can "
                "diverge with no error. Pass variance_bias_correction=True (spec Z17), or scale lr by "
                f"{1 / inflation:.3g}, or freeze later", UserWarning, stacklevel=3)

    def _anchor(self) -> None:
        """x_anchor = x (P5: the parameters every rank holds alike where phase 2 starts)."""
        for seg in self.buckets:
            for a, p in zip(seg.views(seg.anchor), seg.params, strict=True):
                self.xp.copy_(a, p)

    def _check_finite(self) -> None:
        # Every rank holds the same averaged gradients, so every rank reaches the same verdict.
        for seg in self.buckets:
            bad = self.xp.first_nonfinite(seg.grad)
            if bad is not None:
                raise UsageError(f"{self.name}: non-finite averaged gradient at step {self.t + 1} (element {bad[0]} "
                                 f"of param group {seg.group}: value {bad[1]}); step not taken, state unchanged")

    def _local_momentum(self, seg: ZeroOneBucket, group: dict[str, Any], out: Tensor) -> Tensor:
        """out = b1 m + (1 - b1) g_r, this rank's gradient (L1), leaving m as it is: on float32 CPU buffers 1-bit
        Adam's fused pass of its line 6 in the core, the same float32 operations as the backend's ops here."""
        b1 = group["betas"][0]
        if fused_ops.accepts(out, seg.grad, seg.exp_avg):
            return fused_ops.local_momentum_(out, seg.grad, seg.exp_avg, b1)
        return self.xp.add_(self.xp.mul_(self.xp.copy_(out, seg.grad), 1 - b1), seg.exp_avg, alpha=b1)

    def _decay(self, seg: ZeroOneBucket, factor: float) -> None:
        if factor != 1.0:
            self.xp.foreach_mul_(seg.params, factor)

    def _phase1(self, seg: ZeroOneBucket, group: dict[str, Any], kind: str) -> None:
        """P2-P4 on the dense (``grad``) or 1-bit (``work``) average of the gradients."""
        xp = self.xp
        (b1, b2), lr = group["betas"], group["lr"]
        gbar = seg.grad if kind == VARIANCE else seg.work
        if kind == VARIANCE:
            xp.addcmul_(xp.mul_(seg.exp_avg_sq, b2), gbar, gbar, value=1 - b2)  # P2
            seg.denom_key = None
        xp.add_(xp.mul_(seg.exp_avg, b1), gbar, alpha=1 - b1)  # P3
        d = self._denom(seg, group, seg.exp_avg)
        self._decay(seg, 1 - lr * group["weight_decay"])  # P4, decoupled (Z3)
        xp.foreach_addcdiv_(seg.params, seg.views(seg.exp_avg), d, value=-lr)

    def _denom(self, seg: ZeroOneBucket, group: dict[str, Any], m: Tensor) -> list[Tensor]:
        """Per layer d = max(sqrt(v / bc2), sqrt(floor)) + eps, and where the floor lifted it max(d, |m|), in
        ``scratch`` (Z12: 1-bit Adam's variance floor and cap; such an element steps at most lr)."""
        self._floored_denom(seg, group)
        return capped_views(self.xp, seg.views, seg.denom, m, seg.scratch, 1.0, seg.floor_denoms, seg.sizes)

    def _floored_denom(self, seg: ZeroOneBucket, group: dict[str, Any]) -> None:
        """``denom`` = max(sqrt(v / bc2), sqrt(floor)) + eps per layer and ``floor_denoms`` (the value of a lifted
        element), before the cap. bc2 = 1 - b2^n_v with ``variance_bias_correction`` (Z17), else 1. Computed again
        only when v, eps or bc2 changed."""
        xp, eps = self.xp, group["eps"]
        n_v = self.var_updates + (self.step_kind() == VARIANCE)  # a variance step's own update counts
        bc = (variance_correction(group["betas"][1], n_v) if self.options.variance_bias_correction and n_v > 0
              else 1.0)
        key = (float(eps), float(bc))
        if seg.denom_key != key:
            root = xp.sqrt(seg.exp_avg_sq, out=seg.denom)
            if bc != 1.0:
                xp.div_(root, math.sqrt(bc))
            ratio = self.options.variance_floor
            seg.floor_denoms = None
            if ratio > 0:
                roots = floor_roots(xp, seg.views(seg.exp_avg_sq), seg.sizes, ratio, bc)
                for view, floor in zip(seg.views(root), roots, strict=True):
                    xp.clamp_min_(view, floor)
            xp.add_(root, eps)
            if ratio > 0:
                seg.floor_denoms = floor_denoms(xp, roots, seg.denom, eps)
            seg.denom_key = key

    def _phase2(self, seg: ZeroOneBucket, group: dict[str, Any], kind: str) -> None:
        """L1-L3 on a local step; L5-L6 on a sync step (``work`` holds ubar, the 1-bit average of u: L4)."""
        xp = self.xp
        lr, wd = group["lr"], group["weight_decay"]
        seg.lrs += lr
        if kind == LOCAL:
            self._local_step(seg, group)
            xp.add_(seg.u, seg.exp_avg, alpha=lr)  # L3
            return
        for p, a in zip(seg.params, seg.views(seg.anchor), strict=True):  # L6 from x_anchor (Z4)
            xp.copy_(p, a)
        if seg.lrs > 0:  # L5, m = ubar / lrs, then L6 as x = x_anchor (1 - lrs wd) - lrs m / d: a local step's pass
            self._step_params(seg, group, xp.div_(seg.work, seg.lrs), 1 - seg.lrs * wd, -seg.lrs)
        else:  # no lr in the interval: no local step moved, m stays, and ubar (the 1-bit average of zeros) is applied
            d = self._denom(seg, group, seg.exp_avg)
            xp.foreach_addcdiv_(seg.params, seg.views(seg.work), d, value=-1.0)
        for a, p in zip(seg.views(seg.anchor), seg.params, strict=True):
            xp.copy_(a, p)
        if self.options.reset_momentum_at_sync:  # Z18: L5's m served the cap above only
            xp.zero_(seg.exp_avg)
        xp.zero_(seg.u)
        seg.lrs = 0.0
        seg.error_lr = lr  # Z21: the errors L4 left are in this sync's lr

    def _local_step(self, seg: ZeroOneBucket, group: dict[str, Any]) -> None:
        """L1 and L2: m = b1 m + (1 - b1) g_r (formed in ``work``, free on a local step, as on a sync step),
        x = x (1 - lr wd) - lr m / d with d capped (Z12)."""
        lr, wd = group["lr"], group["weight_decay"]
        self._step_params(seg, group, self._local_momentum(seg, group, seg.work), 1 - lr * wd, -lr)  # L1, L2

    def _step_params(self, seg: ZeroOneBucket, group: dict[str, Any], m: Tensor, decay: float, value: float) -> None:
        """m (formed in ``work``) into ``exp_avg``, then x = x * decay + value * m / d with d capped (Z12): L2 of a
        local step and L5-L6 of a sync step. On float32 CPU buffers (both faces' usual case) 1-bit Adam's fused
        pass of its lines 12-13 in the core, the same float32 operations as the backend's ops here, which take
        about eight passes and two temporary buffers."""
        xp = self.xp
        self._floored_denom(seg, group)
        if fused_ops.accepts(m, seg.exp_avg, seg.denom, *(p for p, n in zip(seg.params, seg.sizes, strict=True) if n)):
            fused_ops.apply_(seg.params, m, seg.exp_avg, seg.denom, seg.sizes, decay, value, seg.floor_denoms)
            return
        xp.copy_(seg.exp_avg, m)
        self._decay(seg, decay)
        d = self._denom(seg, group, seg.exp_avg)
        xp.foreach_addcdiv_(seg.params, seg.views(seg.exp_avg), d, value=value)

    # -- checkpoints -----------------------------------------------------------------------------------
    def _copy(self, x: Tensor) -> Tensor:
        return self.xp.copy_(self.xp.zeros_like(x), x)

    def state_dict(self) -> dict[str, Any]:
        """The ``hvd_compress`` section (spec section 6; m and v are the wrapped optimizer's state)."""
        return {
            "algorithm": self.name,
            "step": self.t,
            "world_size": ops.size(),
            "options": dataclasses.asdict(self.options),
            "counters": [self.var_interval, self.var_counter, self.local_step_interval, self.local_step_counter],
            "buckets": [
                {**self.layout_state(seg), "onebit": seg.onebit.state_dict(), "u": self._copy(seg.u),
                 "anchor": self._copy(seg.anchor), "lrs": float(seg.lrs), "error_lr": float(seg.error_lr)}
                for seg in self.buckets
            ],
        }

    def check_state_dict(self, ours: dict[str, Any]) -> None:
        """A clear ValueError, before anything changes, if ``ours`` cannot be loaded here."""
        what = f"{self.name}.load_state_dict"
        self.check_owner(ours)
        if ours.get("world_size") != ops.size():
            raise ValueError(f"{what}: checkpoint world size {ours.get('world_size')} != {ops.size()} (the error "
                             "feedback and the local state are per rank)")
        counters = ours.get("counters")
        if not isinstance(counters, list) or len(counters) != 4:
            raise ValueError(f"{what}: the checkpoint's schedule counters are {counters!r}")
        saved = ours.get("buckets", [])
        self.check_layout(saved)
        for seg, s in zip(self.buckets, saved, strict=True):
            seg.onebit.check_state_dict(s["onebit"])
            for key in ("u", "anchor"):
                if self.xp.describe(s.get(key)) != self.xp.describe(getattr(seg, key)):
                    raise ValueError(f"{what}: {key} is {self.xp.describe(s.get(key))}, expected "
                                     f"{self.xp.describe(getattr(seg, key))}")

    def check_plain_step(self, t: int, key: str) -> None:
        """A plain checkpoint (no ``key`` section) starts phase 1 with fresh errors; phase 2 needs u and x_anchor."""
        if t > self.options.var_freeze_step:
            raise ValueError(f"{self.name}: the optimizer state (step {t}) has no '{key}' section, which is needed "
                             f"after var_freeze_step={self.options.var_freeze_step} (u, x_anchor, error feedback)")

    def error_feedback_buffers(self) -> list[Tensor]:
        return [e for seg in self.buckets for e in (seg.onebit.worker_error, seg.onebit.server_error)]

    def per_rank_what(self) -> str | None:
        """The errors, and in phase 2 each rank's local steps: m, u (L1-L3)."""
        return "error feedback and local-step state (m, u)"

    def load_state_dict(self, ours: dict[str, Any] | None, plain_step: int = 0) -> None:
        """Restore ``state_dict()``, or start a plain checkpoint's step ``plain_step`` (call the checks first); a step
        started but not taken is dropped first. The saved counters stand even where the options changed."""
        self.abandon()
        for seg in self.buckets:
            seg.denom_key = None
        if ours is None:
            self._replay(plain_step)
            self.reset_error_feedback()
            for seg in self.buckets:
                self.xp.zero_(seg.u)
                seg.lrs, seg.error_lr = 0.0, 0.0
            self._anchor()
            return
        self.restore_schedule(int(ours["step"]), ours["counters"])
        for seg, saved in zip(self.buckets, ours["buckets"], strict=True):
            seg.onebit.load_state_dict(saved["onebit"])
            self.xp.copy_(seg.u, saved["u"])
            self.xp.copy_(seg.anchor, saved["anchor"])
            seg.lrs = float(saved["lrs"])
            seg.error_lr = float(saved.get("error_lr", math.nan))  # none saved: taken to be the next sync's
