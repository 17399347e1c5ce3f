"""NumPy simulation of 0/1 Adam over n virtual ranks, written from docs/algorithms/zero-one-adam-spec.md
(section 2, lines P1-P5 and L1-L6; schedules of section 3; ambiguities Z1-Z21), independently of any framework.

Lu et al., ICLR 2023 (arXiv 2202.06009), Algorithm 1, as DeepSpeed's ``runtime/fp16/onebit/zoadam.py`` instantiates
it: variance updated from the dense average on an exponentially sparser schedule up to ``var_freeze_step``, 1-bit
compressed gradients in between; then local steps whose accumulated update u is 1-bit averaged on a doubling
schedule; d with the variance floor and its cap of Z12. The 1-bit exchange is
``reference.onebit.compressed_allreduce`` (through ``CompressorState``), the same worker and server error feedback
as 1-bit Adam. Everything a resumed run needs is in ``ZeroOneAdamState``; ``state_dict``/``load_state_dict``
round-trip it. Inputs and outputs are lists with one array per virtual rank; float64, except that the compressor
rounds to float32 as the core does."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hvd_compress.reference.onebit import CompressorState, _capped, _floored_root, _layers, f32

#: Step kinds (spec section 3): dense variance step, 1-bit gradient step, local step, 1-bit sync of u.
VARIANCE, ONEBIT, LOCAL, SYNC = "variance", "onebit", "local", "sync"


@dataclass(frozen=True)
class Options:
    """0/1 Adam's options with DeepSpeed's names and defaults (spec section 5), but for the guards that train:
    ``variance_floor`` (Z12) and ``variance_bias_correction`` (Z17); ``compress=False`` replaces the 1-bit exchange
    by the exact mean (a test switch: no compression error)."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    var_freeze_step: int = 100000
    var_update_scaler: int = 16
    local_step_scaler: int = 32678
    local_step_clipper: int = 16
    variance_floor: float = 0.01
    variance_bias_correction: bool = True
    reset_momentum_at_sync: bool = False
    compress: bool = True

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        if not self.eps > 0 or self.weight_decay < 0:
            raise ValueError(f"eps must be > 0 and weight_decay >= 0, got {self.eps}, {self.weight_decay}")
        for name, least in (("var_freeze_step", 0), ("var_update_scaler", 1), ("local_step_scaler", 1),
                            ("local_step_clipper", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        if not 0 <= self.variance_floor < np.inf:
            raise ValueError(f"variance_floor must be a finite number >= 0, got {self.variance_floor}")


@dataclass
class ZeroOneAdamState:
    """All that a run needs to continue bit for bit (spec section 6), per virtual rank where ranks differ."""

    t: int  # steps taken
    x: list[np.ndarray]  # parameters
    m: list[np.ndarray]  # momentum (equal on all ranks in phase 1 and right after a sync)
    v: np.ndarray  # variance (equal on all ranks: only the dense average enters it)
    u: list[np.ndarray]  # sum of lr * m since the last sync (phase 2)
    anchor: np.ndarray  # the parameters at the last sync, theta_{t'} (equal on all ranks)
    lrs: float  # sum of lr since the last sync
    error_lr: float = 0.0  # the lr of the sync that left the phase-2 errors, the units they are in (Z21; 0: none)
    var_interval: int = 1
    var_counter: int = 0
    local_step_interval: int = 1
    local_step_counter: int = 0
    var_updates: int = 0  # variance updates so far (n_v: what ``variance_bias_correction`` divides v by)
    comp: CompressorState = field(default_factory=lambda: CompressorState([], []))

    @classmethod
    def zeros(cls, x0: np.ndarray | Sequence[np.ndarray], n: int) -> ZeroOneAdamState:
        xs = [np.asarray(x0, dtype=np.float64).copy() for _ in range(n)] if isinstance(x0, np.ndarray) else [
            np.asarray(x, dtype=np.float64).copy() for x in x0]
        d = xs[0].size
        return cls(t=0, x=xs, m=[np.zeros(d) for _ in range(n)], v=np.zeros(d), u=[np.zeros(d) for _ in range(n)],
                   anchor=xs[0].copy(), lrs=0.0, comp=CompressorState.zeros(d, n))


def state_dict(state: ZeroOneAdamState) -> dict[str, object]:
    """A deep copy of every field (error feedback and the local-step buffers included: Z13)."""
    out = {k: copy.deepcopy(getattr(state, k)) for k in ZeroOneAdamState.__dataclass_fields__ if k != "comp"}
    out["worker_error"] = [e.copy() for e in state.comp.worker]
    out["server_error"] = [e.copy() for e in state.comp.server]
    return out


def load_state_dict(saved: dict[str, object]) -> ZeroOneAdamState:
    fields = {k: copy.deepcopy(v) for k, v in saved.items() if k not in ("worker_error", "server_error")}
    comp = CompressorState([e.copy() for e in saved["worker_error"]], [e.copy() for e in saved["server_error"]])
    return ZeroOneAdamState(**fields, comp=comp)


def step_kind(state: ZeroOneAdamState, opts: Options) -> str:
    """What step t = state.t + 1 does (spec section 3). DeepSpeed's counter is s = t + 1 (Z1)."""
    t = state.t + 1
    s = t + 1
    if t <= opts.var_freeze_step:
        return VARIANCE if s % state.var_interval == 0 else ONEBIT
    return SYNC if s % state.local_step_interval == 0 else LOCAL


def _advance_schedules(state: ZeroOneAdamState, opts: Options) -> None:
    """The counters after step t = state.t (spec S1-S3; zoadam.py l.271-292)."""
    s = state.t + 1
    if state.t <= opts.var_freeze_step:
        if s % state.var_interval == 0:
            state.var_counter += 1
            if state.var_counter == opts.var_update_scaler:
                state.var_counter, state.var_interval = 0, state.var_interval * 2
    else:
        state.local_step_counter += 1
        if state.local_step_counter == opts.local_step_scaler:
            state.local_step_counter = 0
            state.local_step_interval = min(opts.local_step_clipper, state.local_step_interval * 2)


def _average(state: ZeroOneAdamState, per_rank: list[np.ndarray], opts: Options) -> np.ndarray:
    """The 1-bit error-compensated average (spec section 4), or the exact mean with ``compress=False``."""
    return state.comp.allreduce(per_rank) if opts.compress else np.mean(per_rank, axis=0)


def errors_to_lr(state: ZeroOneAdamState, lr: float) -> None:
    """Z21: the phase-2 errors, made by a sync at ``state.error_lr``, brought to the units of a sync at ``lr``
    before its exchange of u (L4): times lr / error_lr rounded to float32 (the errors are float32), dropped where
    either lr is 0. u sums lr m (L3), so its error scales with the lr; at lr 0 nothing moves."""
    if lr == state.error_lr > 0:
        return
    comp = state.comp
    if lr > 0 and state.error_lr > 0:
        factor = f32(lr / state.error_lr)
        comp.worker = [f32(e * factor) for e in comp.worker]
        comp.server = [f32(e * factor) for e in comp.server]
    else:
        comp.worker = [np.zeros_like(e) for e in comp.worker]
        comp.server = [np.zeros_like(e) for e in comp.server]


def _denominator(v: np.ndarray, layers: Sequence[slice], opts: Options,
                 var_updates: int) -> Callable[[np.ndarray], np.ndarray]:
    """m -> the d that m is divided by (Z10, Z12): max(sqrt(v / bc2), sqrt(floor)) + eps per layer, 1-bit Adam's
    variance floor (floor = variance_floor * max(mean v over the layer, a share of mean v over the bucket) / bc2),
    and where the floor lifted d, max(d, |m|): such an element steps at most lr. bc2 = 1 - beta2^n_v after n_v
    variance updates with ``variance_bias_correction`` (Z17), else 1 (DeepSpeed's rule, Z2)."""
    same = lambda a: a  # noqa: E731 (float64 throughout)
    bc2 = 1 - opts.betas[1] ** var_updates if opts.variance_bias_correction and var_updates > 0 else 1.0
    root, floors = _floored_root(v, layers, bc2, opts.variance_floor, same, same)
    d = root + opts.eps
    if opts.variance_floor == 0:
        return lambda m: d
    return lambda m: _capped(d, m, layers, floors, opts.eps, 1.0, same)


def step(state: ZeroOneAdamState, grads: Sequence[np.ndarray], lr: float, opts: Options,
         sizes: Sequence[int] | None = None) -> str:
    """One step of every virtual rank on its gradient ``grads[r]``; returns the step's kind. ``sizes``: the layers
    of the parameters, which the variance floor is taken over (default: one layer)."""
    b1, b2 = opts.betas
    layers = _layers(sizes if sizes is not None else [state.v.size], state.v.size)
    lam = opts.weight_decay
    n = len(state.x)
    g = [np.asarray(gr, dtype=np.float64) for gr in grads]
    kind = step_kind(state, opts)
    state.t += 1
    if kind == VARIANCE:
        gbar = np.mean(g, axis=0)  # P1: dense average
        state.v = b2 * state.v + (1 - b2) * gbar * gbar  # P2
        state.var_updates += 1
        state.m = [b1 * state.m[0] + (1 - b1) * gbar for _ in range(n)]  # P3
    elif kind == ONEBIT:
        gbar = _average(state, g, opts)  # P1': 1-bit average of the gradients (Z5)
        state.m = [b1 * state.m[0] + (1 - b1) * gbar for _ in range(n)]  # P3
    d = _denominator(state.v, layers, opts, state.var_updates)  # P4 / L2: the denominator of this step's v
    if kind in (VARIANCE, ONEBIT):
        state.x = [x - lr * state.m[0] / d(state.m[0]) - lr * lam * x for x in state.x]  # P4 (decoupled decay: Z3)
        if state.t == opts.var_freeze_step:  # P5: the switch; errors restart in u's units (Z7)
            state.comp = CompressorState.zeros(state.x[0].size, n)
            state.anchor = state.x[0].copy()
    else:
        state.lrs += lr  # L3
        m_before = [m.copy() for m in state.m]
        for r in range(n):
            state.m[r] = b1 * state.m[r] + (1 - b1) * g[r]  # L1
            state.u[r] = state.u[r] + lr * state.m[r]  # L3
            state.x[r] = state.x[r] - lr * state.m[r] / d(state.m[r]) - lr * lam * state.x[r]  # L2
        if kind == SYNC:
            errors_to_lr(state, lr)  # Z21
            ubar = _average(state, state.u, opts)  # L4
            state.error_lr = lr
            # L5; with no lr over the interval no step moved, m stays as it was before this step (and ubar is 0: Z21)
            state.m = [ubar / state.lrs for _ in range(n)] if state.lrs > 0 else m_before
            x = state.anchor - ubar / d(state.m[0]) - state.lrs * lam * state.anchor  # L6 (Z3, Z4)
            state.x = [x.copy() for _ in range(n)]
            state.anchor = x.copy()
            if opts.reset_momentum_at_sync:  # Z18: m = 0 once L6 has used L5's m for its cap
                state.m = [np.zeros_like(x) for _ in range(n)]
            state.u = [np.zeros_like(x) for _ in range(n)]
            state.lrs = 0.0
    _advance_schedules(state, opts)
    return kind


def synchronize_parameters(state: ZeroOneAdamState, opts: Options) -> None:
    """Spec Z20: end the local interval now, x = x_anchor = the exact mean of the ranks' x, u = 0, lrs = 0 (m, v,
    the errors and the schedules stay); before phase 2 (no step yet, or t < var_freeze_step) nothing."""
    if state.t == 0 or state.t < opts.var_freeze_step:
        return
    x = np.mean(state.x, axis=0)
    state.x = [x.copy() for _ in state.x]
    state.anchor = x.copy()
    state.u = [np.zeros_like(x) for _ in state.x]
    state.lrs = 0.0


@dataclass
class Trace:
    """Every rank's parameters after every step (``params[t][r]``), each step's kind, and the final state."""

    params: list[list[np.ndarray]]
    kinds: list[str]
    state: ZeroOneAdamState


def zero_one_adam(
    x0: np.ndarray | Sequence[np.ndarray] | None,
    grads: Sequence[Sequence[np.ndarray]],
    lr: float | Sequence[float] = 1e-3,
    state: ZeroOneAdamState | None = None,
    sizes: Sequence[int] | None = None,
    **options: object,
) -> Trace:
    """Run ``len(grads)`` steps (``grads[i][r]``: rank r's gradient at the i-th step of this call), from ``x0``
    or from ``state`` (a resumed run: ``x0`` is then ignored); ``lr`` is a constant or one value per step;
    ``sizes`` the layers (``step``)."""
    opts = Options(**options)
    st = state if state is not None else ZeroOneAdamState.zeros(x0, len(grads[0]))
    params, kinds = [], []
    for i, step_grads in enumerate(grads):
        kinds.append(step(st, step_grads, float(lr[i]) if isinstance(lr, Sequence) else float(lr), opts, sizes))
        params.append([x.copy() for x in st.x])
    return Trace(params, kinds, st)


def schedule(steps: int, **options: object) -> list[str]:
    """The kinds of steps 1..``steps`` (they depend on the options only, never on the data)."""
    opts = Options(**options)
    st = ZeroOneAdamState.zeros(np.zeros(1), 1)
    out = []
    for _ in range(steps):
        out.append(step_kind(st, opts))
        st.t += 1
        _advance_schedules(st, opts)
    return out
