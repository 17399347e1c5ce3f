"""``hvd_compress.ops.backend.Backend`` on NumPy arrays: the TensorFlow face's element-wise primitives.

Why NumPy and not TF ops: the algorithms (``hvd_compress/algorithms``) are plain Python with run-time
decisions (warm-up or compression by the step count, per-layer trust ratios as Python floats, a raise on
non-finite input). Inside a ``tf.function`` (``model.fit``) TF ops only build a graph, so those decisions
would freeze at trace time. The TF face therefore runs a whole optimizer step inside one
``tf.numpy_function(stateful=True)`` per step, where TF hands its buffers over as NumPy arrays; the
algorithm runs on those (copied into arrays of our own: TF's inputs alias its tensors and variables and
are never written) and the results go back as aligned arrays (zero copy).

Rounding follows the torch backend (the reference order): float32 scalars on float32 buffers; half
buffers compute in float32 and round once; ``x + alpha * y`` and ``x + value * a * b`` with one rounding,
as torch's CPU kernels (fused multiply-add), computed in float64 and rounded once to the buffer's dtype
(the float64 product of two float32 values is exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hvd_compress.ops import masks as mask_ops
from hvd_compress.ops import scaled_add_kernels as scaled_add_ops

ALIGN = 64  # TF adopts a returned array without a copy only at this alignment (and DLPack aborts below it)


def aligned_empty(numel: int, dtype: np.dtype | str) -> np.ndarray:
    """An uninitialized 1-D array of ``numel`` elements whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.empty(numel * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + numel * dtype.itemsize].view(dtype)


def aligned_copy(x: np.ndarray) -> np.ndarray:
    """A 64-byte aligned, contiguous copy of ``x`` with its shape."""
    out = aligned_empty(x.size, x.dtype).reshape(x.shape)
    np.copyto(out, x)
    return out


def _wide(x: np.ndarray) -> type:
    """The dtype a primitive computes in: float32 for half buffers (as torch's opmath), else the buffer's."""
    return np.float32 if x.dtype == np.float16 else x.dtype.type


def _fma(out: np.ndarray, base: np.ndarray, p: np.ndarray, q: np.ndarray | float) -> np.ndarray:
    """out = base + p * q rounded once in the compute dtype (torch's CPU ``fmadd``), then to ``out``'s dtype.

    float32 with a scalar q (the usual case): the core's fma (``ops.scaled_add_kernels``), torch's one rounding.
    Otherwise in float32 the float64 product of two float32 values is exact, so only the sum is rounded (twice, to
    float64 and then float32, which differs from one rounding with probability about 2**-29)."""
    wide = _wide(out)
    if np.isscalar(q) and scaled_add_ops.accepts(out, base, p):  # the core's fma: one rounding, no temporaries
        return scaled_add_ops.scaled_add_(out, base, p, q)
    if wide is np.float32:
        exact = base.astype(np.float64) + p.astype(np.float64) * np.float64(q) if np.isscalar(q) else (
            base.astype(np.float64) + p.astype(np.float64) * q.astype(np.float64))
        value = exact.astype(np.float32)
    else:
        value = base + p * q
    with np.errstate(over="ignore"):
        np.copyto(out, value, casting="unsafe")
    return out


class NumpyBackend:
    """The algorithms' element-wise primitives on NumPy arrays (in place)."""

    @staticmethod
    def float32_like(numel: int, like: object) -> np.ndarray:
        del like  # the TF face runs on the CPU
        out = aligned_empty(int(numel), np.float32)
        out.fill(0)
        return out

    @staticmethod
    def describe(x: object) -> tuple[str, int] | None:
        if not isinstance(x, np.ndarray):
            return None
        return str(x.dtype), int(x.size)

    @staticmethod
    def zero_(x: np.ndarray) -> np.ndarray:
        x.fill(0)
        return x

    @staticmethod
    def zeros_like(x: np.ndarray) -> np.ndarray:
        out = aligned_empty(x.size, x.dtype).reshape(x.shape)
        out.fill(0)
        return out

    @staticmethod
    def copy_(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        np.copyto(dst, np.asarray(src).reshape(dst.shape), casting="unsafe")
        return dst

    @staticmethod
    def _store(x: np.ndarray, value: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # a half overflow becomes inf, as in torch (no warning)
            np.copyto(x, value, casting="unsafe")
        return x

    @staticmethod
    def add_(x: np.ndarray, y: np.ndarray | float, alpha: float = 1.0) -> np.ndarray:
        wide = _wide(x)
        if isinstance(y, np.ndarray):
            if alpha == 1.0 and x.dtype == y.dtype and wide is x.dtype.type:
                np.add(x, y, out=x)
                return x
            if wide is x.dtype.type:
                return _fma(x, x, y, wide(alpha))  # torch: fmadd(y, alpha, x)
            return _fma(x, x, y.astype(wide) * wide(alpha), 1.0)  # half: the torch backend's addcmul_ path
        if wide is not x.dtype.type:
            return NumpyBackend._store(x, x.astype(wide) + wide(y))
        np.add(x, wide(y), out=x)
        return x

    @staticmethod
    def mul_(x: np.ndarray, y: np.ndarray | float) -> np.ndarray:
        if x.dtype == np.float16:
            other = y.astype(np.float32) if isinstance(y, np.ndarray) else np.float32(y)
            return NumpyBackend._store(x, x.astype(np.float32) * other)
        np.multiply(x, y if isinstance(y, np.ndarray) else x.dtype.type(y), out=x, casting="unsafe")
        return x

    @staticmethod
    def lerp_(x: np.ndarray, y: np.ndarray, weight: float) -> np.ndarray:
        """torch's CPU lerp: d = y - x rounded, then one fused multiply-add, x + w d (|w| < 0.5) or y + (w - 1) d."""
        wide = _wide(x)
        w = wide(weight)
        d = y.astype(wide) - x.astype(wide)
        if abs(w) < 0.5:
            return _fma(x, x.astype(wide), d, w)
        return _fma(x, y.astype(wide), d, wide(w - wide(1)))

    @staticmethod
    def div_(x: np.ndarray, y: np.ndarray | float) -> np.ndarray:
        if x.dtype == np.float16:
            other = y.astype(np.float32) if isinstance(y, np.ndarray) else np.float32(y)
            return NumpyBackend._store(x, x.astype(np.float32) / other)
        np.divide(x, y if isinstance(y, np.ndarray) else x.dtype.type(y), out=x, casting="unsafe")
        return x

    @staticmethod
    def addcmul_(x: np.ndarray, a: np.ndarray, b: np.ndarray, value: float) -> np.ndarray:
        wide = _wide(x)
        # torch: fmadd(value * a, b, x)
        return _fma(x, x, a.astype(wide, copy=False) * wide(value), b.astype(wide, copy=False))

    @staticmethod
    def reciprocal_(x: np.ndarray) -> np.ndarray:
        if _wide(x) is x.dtype.type:
            return np.reciprocal(x, out=x)
        return NumpyBackend._store(x, np.reciprocal(x.astype(_wide(x))))

    @staticmethod
    def abs(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        np.abs(x, out=out)
        return out

    @staticmethod
    def sqrt(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        if _wide(x) is x.dtype.type and out.dtype == x.dtype:  # the same rounding, without the temporaries
            return np.sqrt(x, out=out)
        return NumpyBackend._store(out, np.sqrt(x.astype(_wide(x))))

    @staticmethod
    def sub(a: np.ndarray, b: np.ndarray, alpha: float, out: np.ndarray) -> np.ndarray:
        wide = _wide(out)
        if wide is out.dtype.type:
            return _fma(out, a, b, wide(-alpha))  # torch: fmadd(b, -alpha, a)
        return _fma(out, a, b.astype(wide) * wide(-alpha), 1.0)  # half: the torch backend's addcmul_ path

    @staticmethod
    def div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        wide = _wide(out)
        if a.dtype.type is wide and b.dtype.type is wide and out.dtype.type is wide:
            return np.divide(a, b, out=out)
        return NumpyBackend._store(out, a.astype(wide) / b.astype(wide))

    @staticmethod
    def foreach_add_(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], alpha: float) -> None:
        for x, y in zip(xs, ys, strict=True):
            NumpyBackend.add_(x, y, alpha=alpha)

    @staticmethod
    def foreach_mul_(xs: Sequence[np.ndarray], scalars: float | Sequence[float]) -> None:
        each = [scalars] * len(xs) if isinstance(scalars, (int, float)) else list(scalars)
        for x, s in zip(xs, each, strict=True):
            NumpyBackend.mul_(x, s)

    @staticmethod
    def foreach_addcdiv_(
        xs: Sequence[np.ndarray], a: Sequence[np.ndarray], b: Sequence[np.ndarray], value: float
    ) -> None:
        for x, ai, bi in zip(xs, a, b, strict=True):
            wide = _wide(x)
            # torch: x + (value * a) / b, each step rounded in the compute dtype
            NumpyBackend._store(x, x.astype(wide, copy=False)
                                + (ai.astype(wide, copy=False) * wide(value)) / bi.astype(wide, copy=False))

    @staticmethod
    def foreach_norm(xs: Sequence[np.ndarray]) -> list[float]:
        return [NumpyBackend.norm(x) for x in xs]

    @staticmethod
    def clamp_min_(x: np.ndarray, value: float) -> np.ndarray:
        np.maximum(x, x.dtype.type(value), out=x)
        return x

    @staticmethod
    def raise_floored(d: np.ndarray, m: np.ndarray, cap: float, floor: float, out: np.ndarray) -> np.ndarray:
        np.copyto(out, m, casting="unsafe")
        np.multiply(np.abs(out, out=out), out.dtype.type(cap), out=out)
        np.maximum(out, d, out=out)
        np.copyto(out, d, where=d > d.dtype.type(floor))
        return out

    @staticmethod
    def foreach_mean(xs: Sequence[np.ndarray]) -> list[float]:
        return [float(x.astype(np.float64).mean()) if x.size else 0.0 for x in xs]

    @staticmethod
    def norm(x: np.ndarray) -> float:
        # Accumulated in float64 and rounded to the dtype: the torch norm's float32 accumulation order is not
        # reproducible here, so a norm may differ from torch's by an ulp of the dtype (docs/tensorflow-keras.md).
        if not x.size:
            return 0.0
        w = x.astype(np.float64)
        return float(_wide(x)(np.sqrt(np.dot(w, w))))

    @staticmethod
    def max(x: np.ndarray) -> float:
        return float(x.max())

    @staticmethod
    def first_nonfinite(x: np.ndarray) -> tuple[int, float] | None:
        bad = np.flatnonzero(~np.isfinite(x))
        if not bad.size:
            return None
        return int(bad[0]), float(x[bad[0]])

    @staticmethod
    def any_nonfinite(x: np.ndarray) -> bool:
        return not bool(np.isfinite(x).all())


    @staticmethod
    def bool_like(numel: int, like: object) -> np.ndarray:
        del like
        out = aligned_empty(int(numel), np.bool_)
        out.fill(False)
        return out

    @staticmethod
    def clamp_(x: np.ndarray, low: float, high: float) -> np.ndarray:
        np.clip(x, x.dtype.type(low), x.dtype.type(high), out=x)
        return x

    @staticmethod
    def masked_norms(x: np.ndarray, mask: np.ndarray) -> tuple[float, float, int]:
        if x.dtype == np.float32 and x.flags.c_contiguous:  # the core's one pass, as the torch face's
            return mask_ops.masked_norms(x, mask.reshape(-1))
        selected = int(np.count_nonzero(mask))
        if selected == mask.size:
            return NumpyBackend.norm(x), 0.0, selected
        if selected == 0:
            return 0.0, NumpyBackend.norm(x), 0
        return NumpyBackend.norm(x[mask]), NumpyBackend.norm(x[~mask]), selected


BACKEND = NumpyBackend()
