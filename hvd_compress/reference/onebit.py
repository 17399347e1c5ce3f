"""Reference error-compensated 1-bit allreduce and the 1-bit Adam / 1-bit LAMB optimizers, n virtual ranks.

Mirrors cpp/src/onebit_kernels.cc and cpp/src/compressed_allreduce.cc one to one, with the same step names
(``compress``, ``accumulate``, ``server_compress``, ``decompress``, ``compressed_allreduce``): paper 003
Algorithm 1 lines 7, 10 and 13 and Section 6; paper 001 Algorithm 1 lines 7-13, Section 5, and its compressor
C[x] = ||x||_2 / sqrt(numel) * Sign(x), a sign of 0 being +1. The buffer is padded to a multiple of 8 * n and cut
into n chunks, chunk j served by rank j; padding counts in no scale, decompresses to nothing and has no error.

Rounding points are those of the C++ (float64 here, rounded to float32 where the C++ stores a float32, which
equals float32 arithmetic exactly): c = f32(x + e); scale = f32(sqrt(sum(c^2) / n_real)), the sum in float64;
error = f32(c -/+ scale); the server sums +/-scale_r in rank order in float32, then f32(sum / n). Errors are
float32 for every buffer dtype; only the order of the float64 sum of squares differs from the C++. The
optimizers (``onebit_adam``, ``onebit_lamb``) simulate the papers' boxes with the same ``variance_floor`` as
``hvd_compress.algorithms.onebit`` (why: docs/algorithms/onebit-adam.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hvd_compress.reference.dtypes import round_to

SUPPORTED = ("float32", "float16", "bfloat16")
#: The variance floor of a layer is at least this share of its bucket's mean frozen v, times the floor.
BUCKET_SHARE = 0.01


def f32(x: np.ndarray | float) -> np.ndarray:
    """Round to float32 and return float64 (the C++'s float32 rounding point)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def padded_numel(numel: int, n: int) -> int:
    """``numel`` rounded up to a multiple of 8 * n (C++ ``onebit_padded_numel``)."""
    unit = 8 * n
    return (numel + unit - 1) // unit * unit


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) of the real elements of each rank's chunk (C = padded / n elements each)."""
    c = padded_numel(numel, n) // n
    return [(min(j * c, numel), min((j + 1) * c, numel)) for j in range(n)]


def pack_signs(signs: np.ndarray, n_padded: int) -> np.ndarray:
    """The wire bytes of ``signs`` (True = non-negative): element 8*i + j is bit j of byte i; padding bits 0."""
    bits = np.zeros(n_padded, dtype=bool)
    bits[: signs.size] = signs
    return np.packbits(bits, bitorder="little")


def _finish(c: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """Signs, scale and new error of compensated values ``c`` (C++ ``finish``)."""
    signs = c >= 0
    if c.size == 0:
        return signs, 0.0, c.copy()
    scale = float(f32(np.sqrt(np.sum(c * c) / c.size)))
    error = f32(np.where(signs, c - scale, c + scale))
    return signs, scale, error


def compress(x: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """Worker step on one chunk (003 Alg. 1 line 7): (signs, scale, new error) of c = x + error."""
    return _finish(f32(np.asarray(x, dtype=np.float64) + error))


def accumulate(acc: np.ndarray, signs: np.ndarray, scale: float) -> np.ndarray:
    """acc + (+/-scale), rounded to float32 (one received chunk)."""
    return f32(acc + np.where(signs, scale, -scale))


def server_compress(acc: np.ndarray, n: int, error: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """Server step (003 Alg. 1 line 10): (signs, scale, new server error) of c = acc / n + error."""
    return _finish(f32(f32(acc / np.float32(n)) + error))


def decompress(signs: np.ndarray, scale: float, dtype: str) -> np.ndarray:
    """+/-scale per element, rounded to the buffer dtype (003 Alg. 1 line 13)."""
    return round_to(np.where(signs, scale, -scale), dtype)


def compressed_allreduce(
    inputs: Sequence[np.ndarray],
    worker_errors: Sequence[np.ndarray],
    server_errors: Sequence[np.ndarray],
    dtype: str = "float32",
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """One call of the core's compressed allreduce on n virtual ranks.

    ``inputs[r]`` (values representable in ``dtype``), ``worker_errors[r]`` (numel) and ``server_errors[r]``
    (padded / n) are rank r's; returns (outputs, new worker errors, new server errors), all float64 arrays.
    Every output is the same array of values.
    """
    if dtype not in SUPPORTED:
        raise ValueError(f"reference compressed_allreduce: dtype {dtype!r} not in {SUPPORTED}")
    n = len(inputs)
    numel = int(np.asarray(inputs[0]).size)
    bounds = chunk_bounds(numel, n)
    c = padded_numel(numel, n) // n
    new_worker = [np.asarray(e, dtype=np.float64).copy() for e in worker_errors]
    new_server = [np.asarray(e, dtype=np.float64).copy() for e in server_errors]
    # Phase 1: every rank compresses every chunk of its buffer; sent[r][j] goes to rank j.
    sent: list[list[tuple[np.ndarray, float]]] = []
    for r in range(n):
        x = np.asarray(inputs[r], dtype=np.float64)
        row = []
        for lo, hi in bounds:
            signs, scale, err = compress(x[lo:hi], new_worker[r][lo:hi])
            new_worker[r][lo:hi] = err
            row.append((signs, scale))
        sent.append(row)
    # Average: rank j sums the chunks j it received in rank order, then re-compresses.
    served = []
    for j, (lo, hi) in enumerate(bounds):
        acc = np.zeros(hi - lo)
        for r in range(n):
            acc = accumulate(acc, *sent[r][j])
        signs, scale, err = server_compress(acc, n, new_server[j][: hi - lo])
        new_server[j][: hi - lo] = err
        served.append((signs, scale))
    # Scatter + result: everyone decompresses every served chunk.
    out = np.zeros(numel)
    for (lo, hi), (signs, scale) in zip(bounds, served, strict=True):
        out[lo:hi] = decompress(signs, scale, dtype)
    assert all(e.size == c for e in new_server)
    return [out.copy() for _ in range(n)], new_worker, new_server


# ---------------------------------------------------------------------------------------------------------------
# Optimizers: simulations over per-rank gradient sequences, grads[t][r] = rank r's gradient at step t + 1.


@dataclass
class CompressorState:
    """Worker and server error of each virtual rank (what ``OneBitState`` holds on a real rank)."""

    worker: list[np.ndarray]
    server: list[np.ndarray]

    @classmethod
    def zeros(cls, numel: int, n: int) -> CompressorState:
        return cls([np.zeros(numel) for _ in range(n)], [np.zeros(padded_numel(numel, n) // n) for _ in range(n)])

    def allreduce(self, per_rank: list[np.ndarray]) -> np.ndarray:
        """The compressed average of float32-rounded ``per_rank`` (updates the errors)."""
        outs, self.worker, self.server = compressed_allreduce([f32(m) for m in per_rank], self.worker, self.server)
        return outs[0]


@dataclass
class OptimizerTrace:
    """Parameters after every step, and the final optimizer state (float64 arrays)."""

    params: list[np.ndarray] = field(default_factory=list)
    state: dict[str, object] = field(default_factory=dict)


def _steps(grads: Sequence[Sequence[np.ndarray]]) -> Callable[[int], list[np.ndarray]]:
    return lambda t: [np.asarray(g, dtype=np.float64) for g in grads[t - 1]]


def _lr_at(lr: float | Sequence[float], t: int) -> float:
    """The learning rate of step t (1-based): a constant, or one value per step (an LR schedule)."""
    return float(lr[t - 1]) if isinstance(lr, Sequence) else float(lr)


def _rounding(dtype: str | None) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """(round to the parameter dtype, round to float32): identities for ``dtype=None`` (exact float64).

    With a dtype the simulations round where the PyTorch face stores a result: momentum, variance and
    parameters in the parameter dtype (one rounding per in-place torch op), the local momentum m_r that
    enters the compressor and LAMB's reconstructed gradient in float32 (its scratch buffers).
    """
    if dtype is None:
        return (lambda a: a), (lambda a: a)
    return (lambda a: round_to(a, dtype)), f32


def _layers(sizes: Sequence[int], numel: int) -> list[slice]:
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    if off[-1] != numel:
        raise ValueError(f"reference onebit optimizer: sizes {list(sizes)} do not cut {numel} elements")
    return [slice(off[i], off[i + 1]) for i in range(len(sizes))]


def _floored_root(
    v: np.ndarray, layers: Sequence[slice], bc2: float, variance_floor: float,
    rd: Callable[[np.ndarray], np.ndarray], r32: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, list[float]]:
    """(max(sqrt(v / bc2), sqrt(floor)) per layer, the per-layer sqrt(floor)) of the frozen v, with
    floor = variance_floor * max(mean(v) over the layer, BUCKET_SHARE * mean(v) over the bucket) / bc2 (the
    bucket's mean as the layers' means weighted by their sizes); rounded where the PyTorch face rounds (the root
    in the state dtype, then float32 with float32 scalars)."""
    root = rd(np.sqrt(v))
    if bc2 != 1.0:
        root = r32(root / r32(np.sqrt(bc2)))
    means = [float(np.mean(v[sl])) if sl.stop > sl.start else 0.0 for sl in layers]
    bucket = BUCKET_SHARE * sum(mean * (sl.stop - sl.start) for mean, sl in zip(means, layers, strict=True)) / max(
        v.size, 1)
    floors = [float(np.sqrt(variance_floor * max(mean, bucket) / bc2)) if sl.stop > sl.start else 0.0
              for mean, sl in zip(means, layers, strict=True)]
    if variance_floor > 0:
        for sl, floor in zip(layers, floors, strict=True):
            root[sl] = np.maximum(root[sl], r32(floor))
    return root, floors


def _capped(d: np.ndarray, m: np.ndarray, layers: Sequence[slice], floors: Sequence[float], eps: float, cap: float,
            r32: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The floor's cap: where the floor lifted d = sqrt(vh) + eps, d is raised to |m| * cap = |mh|, so that such an
    element steps at most lr (1-bit LAMB: its layer's lr r c_avg)."""
    d = d.copy()
    for sl, floor in zip(layers, floors, strict=True):
        lifted = d[sl] <= r32(r32(floor) + r32(eps))
        d[sl] = np.where(lifted, np.maximum(d[sl], r32(np.abs(m[sl]) * cap)), d[sl])
    return d


def _check_floor(variance_floor: float) -> None:
    if not 0 <= variance_floor < np.inf:
        raise ValueError(f"variance_floor must be a finite number >= 0 (0: the papers' rule), got {variance_floor}")


def onebit_adam(
    x0: np.ndarray,
    grads: Sequence[Sequence[np.ndarray]],
    sizes: Sequence[int] | None = None,
    *,
    lr: float | Sequence[float] = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    freeze_step: int = 1,
    bias_correction: bool = False,
    decoupled: bool = True,
    dtype: str | None = None,
    variance_floor: float = 0.01,
    cap_floored: bool = True,
) -> OptimizerTrace:
    """1-bit Adam (paper 003, Algorithm 1) on n = len(grads[0]) virtual ranks, steps t = 1..len(grads).

    - Warm-up, t <= freeze_step (line 2, "the original Adam"): g = mean over ranks of grads (a dense
      average); m = m + (1 - b1) (g - m) (= b1 m + (1 - b1) g, rounded as torch's Adam's ``lerp_``);
      v = b2 v + (1 - b2) g^2.
    - Compression, t > freeze_step (lines 5-13): v stays v_{freeze_step}; every rank forms
      m_r = b1 m + (1 - b1) g_r from the shared m of the last step and its own gradient; m becomes the
      compressed average of the m_r (``compressed_allreduce``, inputs rounded to float32, errors carried
      over, float32 buffer).
    - Update, every step: u = mh / (sqrt(vh) + eps), with mh = m / (1 - b1^t) and vh = v / (1 - b2^s)
      (s = t in warm-up, s = freeze_step after it) when ``bias_correction`` (torch's Adam), else mh = m,
      vh = v (DeepSpeed's OnebitAdam, which has no bias correction). Weight decay, ``decoupled`` (AdamW, and
      DeepSpeed's ``update += weight_decay * p``): x = x - lr * (u + weight_decay * x); else L2 as torch's
      Adam: every rank's gradient becomes g_r + weight_decay * x before anything else.
    The paper's line 13 has no eps; it is kept as in the warm-up so the two stages share one rule.
    In compression, sqrt(vh) is max(sqrt(vh), sqrt(variance_floor * mean(vh))) per layer (``sizes`` cuts x into
    layers; one layer if None): ``_floored_root``; where the floor lifted it, d = sqrt(vh) + eps is raised to |mh|
    (the floor's cap: such an element steps at most lr; ``cap_floored=False`` leaves it out, for tests that show the
    cap acts); ``variance_floor=0`` is line 13 as written. ``dtype`` (parameters, gradients, momentum and variance
    in that dtype) rounds as ``_rounding`` says; the L2 term is then added to the averaged gradient in warm-up, and
    as (1 - b1) wd x to (1 - b1) g_r in compression, as the PyTorch face does.
    """
    _check_floor(variance_floor)
    b1, b2 = betas
    n = len(grads[0])
    rd, r32 = _rounding(dtype)
    x = rd(np.asarray(x0, dtype=np.float64))
    layers = _layers(sizes if sizes is not None else [x.size], x.size)
    m, v = np.zeros_like(x), np.zeros_like(x)
    comp = CompressorState.zeros(x.size, n)
    trace = OptimizerTrace()
    at = _steps(grads)
    for t in range(1, len(grads) + 1):
        g = [rd(gr) for gr in at(t)]
        if t <= freeze_step:
            gm = rd(np.mean(g, axis=0))
            if not decoupled:
                gm = r32(gm + weight_decay * x)
            m = rd(m + (1 - b1) * r32(gm - m))  # torch's Adam: m.lerp_(g, 1 - b1), one rounding of the sum
            v = rd(rd(b2 * v) + (1 - b2) * gm * gm)
        else:
            l2 = 0.0 if decoupled else (1 - b1) * weight_decay
            m = rd(comp.allreduce([r32(r32(r32((1 - b1) * gr) + l2 * x) + b1 * m) for gr in g]))
        s = min(t, freeze_step)
        mh = m / (1 - b1**t) if bias_correction else m
        vh = v / (1 - b2**s) if bias_correction and s > 0 else v
        if t <= freeze_step:
            u = mh / (r32(np.sqrt(vh)) + eps)
        else:
            bc2 = 1 - b2**freeze_step if bias_correction else 1.0
            root, floors = _floored_root(v, layers, bc2, variance_floor, rd, r32)
            d = r32(root + r32(eps))
            if variance_floor > 0 and cap_floored:
                d = _capped(d, m, layers, floors, eps, r32(1 / (1 - b1**t)) if bias_correction else 1.0, r32)
            u = mh / d
        if decoupled:
            x = rd(x * (1 - _lr_at(lr, t) * weight_decay))
        x = rd(x - _lr_at(lr, t) * u)
        trace.params.append(x.copy())
    trace.state = {"exp_avg": m, "exp_avg_sq": v, "worker_error": comp.worker, "server_error": comp.server}
    return trace


def onebit_lamb(
    x0: np.ndarray,
    grads: Sequence[Sequence[np.ndarray]],
    sizes: Sequence[int] | None = None,
    *,
    lr: float | Sequence[float] = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    freeze_step: int = 1,
    coeff_beta: float = 0.9,
    min_coeff: float = 0.01,
    max_coeff: float = 10.0,
    factor_min: float = 0.5,
    factor_max: float = 4.0,
    factor_threshold: float = 0.1,
    bias_correction: bool = False,
    dtype: str | None = None,
    variance_floor: float = 0.01,
    cap_floored: bool = True,
) -> OptimizerTrace:
    """1-bit LAMB (paper 001, Algorithm 1) on n virtual ranks; ``sizes`` cuts the fused buffer into layers.

    - Warm-up, t <= freeze_step (line 2, LAMB of eq. (1) with the clip on the whole ratio, footnote 3):
      g = dense mean of grads; m, v as Adam (no bias correction, as DeepSpeed's OnebitLamb);
      per layer u = m / (sqrt(v) + eps) + weight_decay * x, c = clip(||x|| / ||u||, min_coeff, max_coeff)
      (c = 1 when either norm is 0), c_avg = coeff_beta * c_avg + (1 - coeff_beta) * c (c_avg starts at 0);
      x = x - lr * c * u. With ``bias_correction`` (hc.Lamb's default) m and v are divided by 1 - b1^t and
      1 - b2^t in u.
    - At the end of step freeze_step (line 3): v_frozen = v; c_avg stops; v_fresh = v keeps updating.
    - Compression (lines 4-21): m_r = b1 m + (1 - b1) g_r; m = compressed average of the fused m_r (one call);
      per layer: g_rec = (m - b1 m_prev) / (1 - b1) (line 15); v_fresh = b2 v_fresh + (1 - b2) g_rec^2
      (line 16); r = max over the layer of (sqrt(v_frozen) + eps) / (sqrt(v_fresh) + eps) (line 17, garbled
      in the text: DeepSpeed's form; with ``bias_correction`` v_frozen / (1 - b2^freeze_step) and
      v_fresh / (1 - b2^t), so that both estimate the same second moment);
      r = clip(r, (1 - factor_threshold) r_prev, (1 + factor_threshold) r_prev) (line 18, r_prev starts at 1),
      then r = clip(r, factor_min, factor_max) (line 19; DeepSpeed clips in the other order, the same r while 1 is
      in [factor_min, factor_max]);
      c = r * c_avg (line 20); u = mh / (sqrt(vh_frozen) + eps) + weight_decay * x;
      x = x - lr * c * u (line 21). DeepSpeed's weight-decay adjustment of r and its per-tensor momentum
      scaling before fusion are not part of the paper and not simulated.
    - Variance floor (``_floored_root``): in compression sqrt(vh_frozen) is max(sqrt(vh_frozen), sqrt(floor))
      per layer, floor = variance_floor * mean(vh_frozen) over the layer, in lines 17 and 21; line 17 floors
      sqrt(vh_fresh) by the same value, so the ratio compares two estimates of one second moment (an
      element dead through warm-up does not make r huge). Where the floor lifted it, d = sqrt(vh_frozen) + eps is
      raised to |mh| in line 21 (``_capped``; not in line 17), unless ``cap_floored=False``.
      ``variance_floor=0`` is the box as written.
    ``dtype`` rounds as ``_rounding`` says.
    """
    _check_floor(variance_floor)
    b1, b2 = betas
    n = len(grads[0])
    rd, r32 = _rounding(dtype)
    x = rd(np.asarray(x0, dtype=np.float64))
    layers = _layers(sizes if sizes is not None else [x.size], x.size)
    m, v = np.zeros_like(x), np.zeros_like(x)
    v_fresh = v
    c_avg = np.zeros(len(layers))
    r_prev = np.ones(len(layers))
    comp = CompressorState.zeros(x.size, n)
    trace = OptimizerTrace()
    at = _steps(grads)

    def bc(beta: float, t: int) -> float:
        return 1 - beta**t if bias_correction else 1.0

    for t in range(1, len(grads) + 1):
        g = [rd(gr) for gr in at(t)]
        step = np.zeros_like(x)
        if t <= freeze_step:
            gm = rd(np.mean(g, axis=0))
            m = rd(rd(b1 * m) + (1 - b1) * gm)
            v = rd(rd(b2 * v) + (1 - b2) * gm * gm)
            for i, sl in enumerate(layers):
                u = m[sl] / bc(b1, t) / (np.sqrt(v[sl] / bc(b2, t)) + eps) + weight_decay * x[sl]
                xn, un = np.linalg.norm(x[sl]), np.linalg.norm(u)
                c = float(np.clip(xn / un, min_coeff, max_coeff)) if xn > 0 and un > 0 else 1.0
                c_avg[i] = coeff_beta * c_avg[i] + (1 - coeff_beta) * c
                step[sl] = c * u
            v_fresh = v.copy()
        else:
            m_prev = m
            out = comp.allreduce([r32(r32((1 - b1) * gr) + b1 * m_prev) for gr in g])
            g_rec = r32((out - b1 * m_prev) / (1 - b1))
            v_fresh = rd(rd(b2 * v_fresh) + (1 - b2) * g_rec * g_rec)
            m = rd(out)
            root, floors = _floored_root(v, layers, bc(b2, freeze_step), variance_floor, rd, r32)
            for i, sl in enumerate(layers):
                frozen = r32(root[sl] + r32(eps))
                fresh = np.sqrt(v_fresh[sl] / bc(b2, t))
                if variance_floor > 0:
                    fresh = np.maximum(fresh, r32(floors[i]))
                ratio = float(np.max(frozen / (fresh + eps))) if frozen.size else 1.0
                ratio = float(np.clip(ratio, (1 - factor_threshold) * r_prev[i], (1 + factor_threshold) * r_prev[i]))
                ratio = float(np.clip(ratio, factor_min, factor_max))
                r_prev[i] = ratio
                if variance_floor > 0 and cap_floored:
                    cap = r32(1 / (1 - b1**t)) if bias_correction else 1.0
                    frozen = _capped(frozen, m[sl], [slice(0, frozen.size)], [floors[i]], eps, cap, r32)
                u = m[sl] / bc(b1, t) / frozen + weight_decay * x[sl]
                step[sl] = ratio * c_avg[i] * u
        x = rd(x - _lr_at(lr, t) * step)
        trace.params.append(x.copy())
    trace.state = {
        "exp_avg": m,
        "exp_avg_sq": v,
        "exp_avg_sq_fresh": v_fresh,
        "lamb_coeff_freeze": c_avg,
        "last_factor": r_prev,
        "worker_error": comp.worker,
        "server_error": comp.server,
    }
    return trace


def over_buckets(
    run: Callable[..., OptimizerTrace],
    x0: np.ndarray,
    grads: Sequence[Sequence[np.ndarray]],
    buckets: Sequence[Sequence[int]],
    **options: object,
) -> np.ndarray:
    """Parameters after every step (steps x numel) of ``run`` (``onebit_adam``/``onebit_lamb`` with its options)
    over the optimizer's buckets, as the real code cuts them (``hvd_compress.algorithms.onebit``: one bucket per
    bucket of each param group and dtype, each with its own error feedback and 1-bit scales). ``buckets``: the
    layer sizes of each bucket, consecutive in parameter order; ``grads[t][r]``: rank r's flat gradient at step t.
    """
    total = sum(sum(s) for s in buckets)
    out = np.zeros((len(grads), total))
    lo = 0
    for layer_sizes in buckets:
        hi = lo + sum(layer_sizes)
        g = [[gr[lo:hi] for gr in step] for step in grads]
        out[:, lo:hi] = np.stack(run(x0[lo:hi], g, list(layer_sizes), **options).params)
        lo = hi
    return out
