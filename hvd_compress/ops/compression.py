"""Compression of the dense path, as Horovod users know it (``compression=`` on ``allreduce`` and on
``DistributedOptimizer``): the description objects both faces use, the error-feedback state, and the call into the
core's ``sparse_allreduce`` (cpp/include/hvdc/sparse_allreduce.h, the one place the math lives; NumPy mirror:
hvd_compress/reference/compression.py).

- ``none``: the plain dense reduction. ``fp16`` / ``bf16``: Horovod's ``FP16Compressor`` semantics: 16-bit values
  on the wire, summed in float32 by the server of each chunk and rounded to 16 bits once.
- ``topk(ratio)``: the k = ratio * numel elements of largest |x + error| travel as (index, value) pairs by
  allgather; the rest stays in the error buffer (error feedback). With ``momentum=mu``: Deep Gradient
  Compression's momentum correction and factor masking (Lin et al., ICLR 2018, Section 3.2), u = mu u + x, v += u,
  top-k of v sent, u and v zeroed where this rank sent (the wrapped optimizer must then add no momentum of its
  own); ``clip_norm`` and ``warmup_steps``/``warmup_stages``: Sections 3.2 and 3.3 (``hvd_compress.ops.dgc``),
  after ``dense_steps`` dense calls. A density at which the ranks' pairs would cost more than a dense reduction
  is sent dense.
- ``randomk(ratio, seed)``: k elements chosen by the core's counter-based RNG from (seed, step), the same on
  every rank, so only the k values travel (one dense allreduce of k floats); error feedback too.

All mutable state of one buffer (error, DGC velocity, step) is one ``CompressionState`` that ``state_dict()`` saves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hvd_compress import _core
from hvd_compress.ops import dgc, runtime
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record

#: The core's kind of each compressor (hvdc::SparseKind).
KINDS = {"fp16": 1, "bf16": 2, "topk": 3, "randomk": 4}
_U64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class Compressor:
    """What a reduction does to the values it sends: ``kind`` (none, fp16, bf16, topk, randomk), the fraction
    ``ratio`` of elements sent (topk/randomk), the RNG ``seed`` (randomk) and DGC's ``momentum`` (topk; 0: off)
    and ``momentum_masking`` (with momentum: zero the velocity where this rank sent), DGC's local gradient
    clipping threshold ``clip_norm`` (topk; 0: off) and sparsity warm-up ``warmup_steps``/``warmup_stages``
    (topk; 0 steps: off) after ``dense_steps`` dense calls (topk; ``hvd_compress.ops.dgc``). Framework-neutral
    and picklable."""

    kind: str
    ratio: float = 1.0
    seed: int = 0
    momentum: float = 0.0
    momentum_masking: bool = True
    clip_norm: float = 0.0
    warmup_steps: int = 0
    warmup_stages: int = 4
    dense_steps: int = 0

    @property
    def stateful(self) -> bool:
        """Whether the compressor keeps an error buffer (and a step) per reduced buffer."""
        return self.kind in ("topk", "randomk")

    def describe(self) -> dict[str, Any]:
        """The compressor as plain data (what a checkpoint records; ``momentum`` only when on, so that the
        checkpoints of plain top-k stay as they were)."""
        out = {"kind": self.kind, "ratio": self.ratio, "seed": self.seed}
        if self.momentum:
            out["momentum"] = self.momentum
            out["momentum_masking"] = self.momentum_masking
        if self.clip_norm:
            out["clip_norm"] = self.clip_norm
        if self.warmup_steps:
            out["warmup_steps"] = self.warmup_steps
            out["warmup_stages"] = self.warmup_stages
        if self.dense_steps:
            out["dense_steps"] = self.dense_steps
        return out

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        """Horovod's ``Compressor.compress``: (the tensor as it would travel, the context ``decompress`` needs).
        fp16/bf16 cast a floating tensor (torch or TensorFlow) to 16 bits, none returns it as it is. Top-k and
        random-k keep error feedback per reduced buffer, so they have no stateless form: pass them as
        ``compression=``."""
        if self.stateful:
            raise TypeError(f"{self!r} keeps error feedback per buffer and has no stateless compress(): pass it "
                            "as compression= to allreduce or DistributedOptimizer")
        if self.kind == "none" or not _is_floating(tensor):
            return tensor, None
        return _cast(tensor, self.kind), _dtype(tensor)

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        """Horovod's ``Compressor.decompress``: back to the dtype ``compress`` recorded in ``ctx``."""
        if self.stateful:
            raise TypeError(f"{self!r} has no stateless decompress(): pass it as compression=")
        return tensor if ctx is None else _cast(tensor, ctx)

    def __repr__(self) -> str:
        if self.kind == "topk":
            extra = f", momentum={self.momentum!r}" if self.momentum else ""
            extra += "" if self.momentum_masking else ", momentum_masking=False"
            extra += f", clip_norm={self.clip_norm!r}" if self.clip_norm else ""
            if self.warmup_steps:
                extra += f", warmup_steps={self.warmup_steps}, warmup_stages={self.warmup_stages}"
            extra += f", dense_steps={self.dense_steps}" if self.dense_steps else ""
            return f"Compression.topk({self.ratio!r}{extra})"
        if self.kind == "randomk":
            return f"Compression.randomk({self.ratio!r}, seed={self.seed})"
        return f"Compression.{self.kind}"


def _is_tensorflow(tensor: Any) -> bool:
    return type(tensor).__module__.startswith("tensorflow")


def _is_floating(tensor: Any) -> bool:
    return bool(tensor.dtype.is_floating if _is_tensorflow(tensor) else tensor.is_floating_point())


def _dtype(tensor: Any) -> Any:
    return tensor.dtype


def _cast(tensor: Any, dtype: Any) -> Any:
    """``tensor`` as ``dtype``: a framework dtype, or "fp16"/"bf16" (torch or TensorFlow, by the tensor's type)."""
    if _is_tensorflow(tensor):
        import tensorflow as tf

        return tf.cast(tensor, {"fp16": tf.float16, "bf16": tf.bfloat16}.get(dtype, dtype))
    if dtype == "fp16":
        return tensor.half()
    if dtype == "bf16":
        return tensor.bfloat16()
    return tensor.to(dtype)


def _check_ratio(ratio: Any) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"compression ratio must be a number in (0, 1], got {ratio!r}")
    return float(ratio)


class Compression:
    """The compressors of ``compression=`` (Horovod's ``hvd.Compression.none``/``fp16`` are accepted too)."""

    none = Compressor("none")
    fp16 = Compressor("fp16")
    bf16 = Compressor("bf16")

    @staticmethod
    def topk(ratio: float, momentum: float = 0.0, momentum_masking: bool = True, clip_norm: float = 0.0,
             warmup_steps: int = 0, warmup_stages: int = 4, dense_steps: int = 0) -> Compressor:
        """Top-k with error feedback: ``ratio`` in (0, 1] of the elements, the largest |x + error|.

        ``momentum`` in (0, 1) turns on Deep Gradient Compression's momentum correction (Lin et al., ICLR 2018):
        the error buffer accumulates a velocity u = momentum * u + x instead of x, and u and the error are zeroed
        where this rank sent. The reduced result is then already momentum-SGD's step direction: wrap a plain
        ``torch.optim.SGD(..., momentum=0)`` (``DistributedOptimizer`` refuses an optimizer with its own momentum,
        which would apply it twice). 0 (the default) is plain top-k, bit for bit. ``momentum_masking=False``
        keeps the velocity where this rank sent (DGC's momentum factor masking off, as the official DGC code's
        ``momentum_masking`` flag; docs/algorithms/compression.md for why).

        The rest of DGC (``hvd_compress.ops.dgc``): ``clip_norm`` > 0 clips each rank's gradient, before it is
        accumulated, to the 2-norm ``clip_norm / sqrt(size)`` (local gradient clipping; ``clip_norm`` is the
        global threshold); ``warmup_steps`` > 0 sends a denser selection over the first ``warmup_steps`` calls,
        ramping the density down exponentially to ``ratio`` in ``warmup_stages`` stages (sparsity warm-up).
        ``dense_steps`` > 0 reduces the first ``dense_steps`` calls densely, before the warm-up (as torch's
        ``start_powerSGD_iter``), the error and velocity then emptied.

        Wherever the ranks' selections could cover the buffer (size * k >= numel: a density of at least
        1 / size), the core sends the whole compensated buffer as a dense reduction instead: fewer bytes than
        the (index, value) pairs, and nothing left behind in the error."""
        if (isinstance(momentum, bool) or not isinstance(momentum, (int, float))
                or not 0.0 <= float(momentum) < 1.0):
            raise ValueError(f"topk momentum must be a number in [0, 1), got {momentum!r}")
        if not isinstance(momentum_masking, bool):
            raise ValueError(f"topk momentum_masking must be True or False, got {momentum_masking!r}")
        if (isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float))
                or not 0.0 <= float(clip_norm) < float("inf")):
            raise ValueError(f"topk clip_norm must be a finite number >= 0 (0: off), got {clip_norm!r}")
        for key, value, low in (("warmup_steps", warmup_steps, 0), ("warmup_stages", warmup_stages, 1),
                                ("dense_steps", dense_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"topk {key} must be an int >= {low}, got {value!r}")
        masking = momentum_masking or not momentum  # without momentum there is nothing to mask
        return Compressor("topk", _check_ratio(ratio), momentum=float(momentum), momentum_masking=masking,
                          clip_norm=float(clip_norm), warmup_steps=warmup_steps,
                          warmup_stages=warmup_stages if warmup_steps else 4, dense_steps=dense_steps)

    @staticmethod
    def randomk(ratio: float, seed: int = 0) -> Compressor:
        """Random-k with error feedback: ``ratio`` in (0, 1] of the elements, drawn from (``seed``, step)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _U64:
            raise ValueError(f"randomk seed must be an int in [0, 2**64), got {seed!r}")
        return Compressor("randomk", _check_ratio(ratio), int(seed))


# Horovod's own compressors (classes with static compress/decompress), by class name, in every face.
_HOROVOD = {"NoneCompressor": Compression.none, "FP16Compressor": Compression.fp16}


def resolve(compression: Any) -> Compressor:
    """The ``Compressor`` for a ``compression=`` argument: ours, None (none), or Horovod's
    ``hvd.Compression.none`` / ``hvd.Compression.fp16``."""
    if compression is None:
        return Compression.none
    if isinstance(compression, Compressor):
        return compression
    cls = compression if isinstance(compression, type) else type(compression)
    if cls.__module__.startswith("horovod.") and cls.__name__ in _HOROVOD:
        return _HOROVOD[cls.__name__]
    raise TypeError(
        f"compression={compression!r} is not supported: use hc.Compression.none, fp16, bf16, topk(ratio) or "
        "randomk(ratio, seed) (Horovod's hvd.Compression.none and fp16 are accepted too)"
    )


class CompressionState:
    """Error feedback of one buffer of ``numel`` elements under ``compressor`` (top-k or random-k): the float32
    ``error`` (input + error - what was sent, on ``like``'s device; with DGC momentum, the accumulator v), the
    float32 ``velocity`` (DGC's u; top-k with momentum only, else None) and the ``step`` (calls completed;
    random-k draws its indices from it). ``sizes`` cuts the buffer into the tensors it fuses (default: one), each of
    which sends its own ratio of elements, as Horovod compresses each gradient on its own. Only a call that
    every rank accepted changes the state."""

    def __init__(
        self, numel: int, compressor: Compressor, xp: Backend, like: Tensor, sizes: list[int] | None = None
    ) -> None:
        if int(numel) < 0:
            raise ValueError(f"CompressionState: numel must be >= 0, got {numel}")
        sizes = [int(numel)] if sizes is None else [int(m) for m in sizes]
        if any(m < 0 for m in sizes) or sum(sizes) != int(numel):
            raise ValueError(f"CompressionState: sizes {sizes} do not add up to numel {numel}")
        self.sizes = sizes
        if not isinstance(compressor, Compressor) or not compressor.stateful:
            raise ValueError(f"CompressionState is for topk/randomk compression, got {compressor!r}")
        self.numel = int(numel)
        self.compressor = compressor
        self.xp = xp
        self.error = xp.float32_like(self.numel, like)
        self.velocity = xp.float32_like(self.numel, like) if compressor.momentum else None
        self.step = 0

    def reset(self) -> None:
        """Forget the accumulated error and the velocity (the step stays)."""
        self.xp.zero_(self.error)
        if self.velocity is not None:
            self.xp.zero_(self.velocity)

    def state_dict(self) -> dict[str, Any]:
        out = {
            "compression": self.compressor.describe(),
            "numel": self.numel,
            "sizes": list(self.sizes),
            "step": self.step,
            "error": self.xp.copy_(self.xp.float32_like(self.numel, self.error), self.error),
        }
        if self.velocity is not None:
            out["velocity"] = self.xp.copy_(self.xp.float32_like(self.numel, self.velocity), self.velocity)
        return out

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise a clear ValueError if ``state`` is not a ``state_dict()`` of a state like this one."""
        want = {"compression": self.compressor.describe(), "numel": self.numel, "sizes": self.sizes}
        for key, value in want.items():
            if state.get(key) != value:
                raise ValueError(
                    f"CompressionState.load_state_dict: {key} is {state.get(key)!r}, this state has {value!r}"
                )
        got = self.xp.describe(state.get("error"))
        if got != ("float32", self.numel):
            raise ValueError(f"CompressionState.load_state_dict: error is {got}, expected float32 x {self.numel}")
        if self.velocity is not None:
            if state.get("velocity") is None:
                raise ValueError(
                    f"CompressionState.load_state_dict: {self.compressor!r} keeps a DGC velocity and the checkpoint "
                    "has none (saved without momentum?); state unchanged"
                )
            got = self.xp.describe(state["velocity"])
            if got != ("float32", self.numel):
                raise ValueError(
                    f"CompressionState.load_state_dict: velocity is {got}, expected float32 x {self.numel}"
                )
        if not isinstance(state.get("step"), int) or state["step"] < 0:
            raise ValueError(f"CompressionState.load_state_dict: step is {state.get('step')!r}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; it must be for the same compressor and numel."""
        self.check_state_dict(state)
        self.xp.copy_(self.error, state["error"].reshape(-1))
        if self.velocity is not None:
            self.xp.copy_(self.velocity, state["velocity"].reshape(-1))
        self.step = int(state["step"])


def compressed_allreduce_(
    tensor: Any,
    compressor: Compressor,
    state: CompressionState | None = None,
    op: Any = ReduceOp.Average,
    name: str | None = None,
    traffic: Traffic | None = None,
) -> Any:
    """Replace ``tensor`` (contiguous CPU float) by its reduction under ``compressor``, in place; returns it.

    ``state`` is required for top-k/random-k (one per buffer, kept across calls) and unused otherwise. A bad
    call on any rank (ratio, op other than Average/Sum, NaN/Inf, a state of another size) raises ``UsageError``
    on every rank with ``tensor`` and ``state`` unchanged; ranks whose kind, ratio, seed or step differ raise
    ``MismatchError``.
    """
    if compressor.kind == "none":
        raise ValueError("compressed_allreduce_: Compression.none is the plain allreduce_")
    if compressor.stateful:
        if not isinstance(state, CompressionState):
            raise TypeError(
                f"{compressor!r} keeps error feedback: pass state=CompressionState(numel, compression) (one per "
                f"tensor, kept across calls), got {type(state).__name__}"
            )
        if state.compressor != compressor:
            raise ValueError(f"state is for {state.compressor!r}, the call asks for {compressor!r}")
    op_value = int(op) if isinstance(op, int) else -1
    error = as_core_buffer(state.error) if compressor.stateful else None
    velocity = as_core_buffer(state.velocity) if compressor.stateful and state.velocity is not None else None
    step, sizes = (state.step, state.sizes) if compressor.stateful else (0, [])
    ratio = dgc.warmup_ratio(compressor.ratio, compressor.warmup_steps, compressor.warmup_stages, step,
                             compressor.dense_steps)
    original = _clip_locally(tensor, compressor, state)
    try:
        counts = _core.sparse_allreduce(
            runtime.get_in_order(), as_core_buffer(tensor), error, KINDS[compressor.kind], op_value, ratio,
            compressor.seed, step, sizes, name or "", velocity=velocity, momentum=compressor.momentum,
            momentum_masking=compressor.momentum_masking,
        )
    except BaseException:
        if original is not None:  # a rejected call leaves the tensor as it came
            state.xp.copy_(tensor, original)
        raise
    record(counts, traffic)
    if compressor.stateful:
        state.step += 1
    return tensor


def _clip_locally(tensor: Any, compressor: Compressor, state: CompressionState | None) -> Any:
    """DGC's local gradient clipping of ``tensor`` in place (``hvd_compress.ops.dgc``); returns a copy of the
    tensor as it came when it was scaled (None when not)."""
    if not compressor.clip_norm:
        return None
    xp, t = state.xp, as_core_buffer(tensor)
    scale = dgc.local_clip_scale(xp.norm(t), compressor.clip_norm, runtime.size())
    if scale == 1.0:
        return None
    original = xp.copy_(xp.zeros_like(t), t)
    xp.mul_(t, scale)
    return original


def sparse_k(numel: int, ratio: float) -> int:
    """Elements top-k/random-k send of ``numel`` at ``ratio`` (the core's rule)."""
    return int(_core.sparse_k(int(numel), float(ratio)))

