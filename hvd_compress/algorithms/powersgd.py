"""PowerSGD: Vogels, Karimireddy and Jaggi, NeurIPS 2019 (arXiv 1905.13727), as a gradient reduction.

Per bucket and step (``reduce_bucket``), as torch's ``powerSGD_hook`` (ddp_comm_hooks/powerSGD_hook.py) runs it:
- before ``start_powerSGD_iter`` steps: a dense average;
- then M = gradient + error (Alg. 2 line 3, error feedback); each parameter viewed as an n x m matrix (its first
  dimension by the rest) is compressed when (n + m) r * min_compression_rate < n m, the others are averaged dense;
- Alg. 1 (one power-iteration step, rank r): Q from the last step (warm start, line 1) or standard normal from a seed
  drawn once per bucket from ``random_seed``'s stream, orthogonalized; P = M Q (line 3); P summed over ranks (line
  4); P orthogonalized (line 5); Q = M^T P (line 6); Q averaged (line 7); the result is P Q^T (line 8);
- error = M - result (Alg. 2 line 5; the dense part's error is its local minus its average, as in torch's hook).

The matrix work runs on the face's ``MatrixBackend``; the reductions are the face's core calls. All state (errors
and the loss scale they are in, P, Q, step, the seed stream) is one picklable ``PowerSGDState``. Options, moving
over from DDP, checkpoints: docs/algorithms/powersgd.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hvd_compress.algorithms import contract
from hvd_compress.ops.backend import Tensor
from hvd_compress.ops.constants import AlgorithmOp

_SEED_BOUND = 1_000_000_000  # torch's hook seeds each random Q draw with rng.randint(10**9)


@dataclasses.dataclass(frozen=True)
class PowerSGDOptions:
    """The options of torch's ``PowerSGDState``, with its names, meanings and defaults."""

    matrix_approximation_rank: int = 1
    start_powerSGD_iter: int = 1_000  # noqa: N815  (torch's name)
    min_compression_rate: float = 2
    use_error_feedback: bool = True
    warm_start: bool = True
    orthogonalization_epsilon: float = 0.0
    random_seed: int = 0

    def validate(self, op_name: str) -> None:
        def integer(x: Any) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        def number(x: Any) -> bool:
            return isinstance(x, (int, float, np.number)) and not isinstance(x, bool)

        if not integer(self.matrix_approximation_rank) or self.matrix_approximation_rank < 1:
            raise ValueError(f"op={op_name}: matrix_approximation_rank must be an int >= 1, "
                             f"got {self.matrix_approximation_rank!r}")
        if not integer(self.start_powerSGD_iter) or self.start_powerSGD_iter < 0:
            raise ValueError(f"op={op_name}: start_powerSGD_iter must be an int >= 0, got {self.start_powerSGD_iter!r}")
        if not number(self.min_compression_rate) or not self.min_compression_rate >= 0:
            raise ValueError(f"op={op_name}: min_compression_rate must be a number >= 0, "
                             f"got {self.min_compression_rate!r}")
        for name in ("use_error_feedback", "warm_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"op={op_name}: {name} must be True or False, got {getattr(self, name)!r}")
        eps = self.orthogonalization_epsilon
        if not number(eps) or not 0 <= eps < float("inf"):
            raise ValueError(f"op={op_name}: orthogonalization_epsilon must be a finite number >= 0, got {eps!r}")
        if not integer(self.random_seed) or not 0 <= self.random_seed < 1 << 32:
            raise ValueError(f"op={op_name}: random_seed must be an int in [0, 2**32), got {self.random_seed!r}")


class PowerSGD:
    """The declaration the faces build ``op=PowerSGD`` from (``algorithms.contract``): a reduction over op=Average's
    buckets with per-bucket state (``lowrank``), under any optimizer."""

    name = "PowerSGD"
    options_cls = PowerSGDOptions
    op = AlgorithmOp("PowerSGD", 22)
    buffers = "lowrank"
    wraps = contract.ANY


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """torch's ``_should_compress``: worth it when (rows + cols) rank * min_compression_rate < rows cols."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


@dataclasses.dataclass(frozen=True)
class Matrix:
    """A compressed parameter of a bucket: its position, its shape as a matrix, its rank and its P/Q offsets."""

    index: int
    rows: int
    cols: int
    rank: int
    p_offset: int
    q_offset: int


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """Which parameters of a bucket are compressed (grouped by matrix shape in first-seen order, the order torch's
    hook draws their random Q in) and which are averaged dense (in bucket order)."""

    compressed: tuple[Matrix, ...]
    dense: tuple[int, ...]
    p_size: int
    q_size: int


def plan_bucket(shapes: Sequence[Sequence[int]], options: PowerSGDOptions) -> BucketPlan:
    """The plan of a bucket whose parameters have ``shapes`` (in buffer order)."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    dense = []
    for i, shape in enumerate(shapes):
        numel = int(np.prod(shape, dtype=np.int64))
        rows = int(shape[0]) if len(shape) else 1
        cols = numel // rows if rows else 0
        rank = min(rows, cols, options.matrix_approximation_rank)
        if should_compress(rows, cols, rank, options.min_compression_rate):
            by_shape.setdefault((rows, cols), []).append(i)
        else:
            dense.append(i)
    compressed, p_off, q_off = [], 0, 0
    for (rows, cols), members in by_shape.items():
        rank = min(rows, cols, options.matrix_approximation_rank)
        for i in members:
            compressed.append(Matrix(i, rows, cols, rank, p_off, q_off))
            p_off, q_off = p_off + rows * rank, q_off + cols * rank
    return BucketPlan(tuple(compressed), tuple(dense), p_off, q_off)


class MatrixBackend(Protocol):
    """The matrix work of PowerSGD on a face's tensors (each one framework op, with that framework's rounding)."""

    def empty_like(self, numel: int, like: Tensor) -> Tensor:
        """A new flat buffer of ``numel`` elements of ``like``'s dtype and device (contents undefined)."""

    def clone(self, x: Tensor) -> Tensor: ...

    def add_(self, x: Tensor, y: Tensor) -> Tensor: ...

    def mul_(self, x: Tensor, factor: float) -> Tensor: ...

    def sub(self, a: Tensor, b: Tensor) -> Tensor:
        """A new tensor a - b."""

    def view(self, flat: Tensor, offset: int, shape: Sequence[int]) -> Tensor:
        """The elements ``offset ..`` of the flat ``flat`` as a contiguous tensor of ``shape``."""

    def cat(self, tensors: Sequence[Tensor], like: Tensor) -> Tensor:
        """A new flat buffer of the tensors' elements one after the other (empty, of ``like``'s dtype, if none)."""

    def split_(self, flat: Tensor, tensors: Sequence[Tensor]) -> None:
        """Copy consecutive pieces of ``flat`` back into ``tensors``."""

    def all_finite(self, x: Tensor) -> bool:
        """Whether every element of ``x`` is finite."""

    def randn_(self, seed: int, outs: Sequence[Tensor]) -> None:
        """Fill ``outs`` in order with standard normal draws from one generator seeded with ``seed``."""

    def orthogonalize_(self, x: Tensor, epsilon: float) -> None:
        """Orthonormal columns of the n x r ``x`` in place (torch's ``_orthogonalize``: Gram-Schmidt with
        ``epsilon`` added to each column's norm for r <= 2 or half precision, else QR). A column of norm zero stays
        zero (its norm taken as the dtype's smallest normal number where torch divides 0 by 0): every other column
        gets torch's bits."""

    def keep_if_zero_column_(self, new: Tensor, old: Tensor) -> None:
        """Where a column of the n x r ``new`` is all zero, ``new`` takes ``old``'s values (all of them)."""

    def matmul(self, a: Tensor, b: Tensor, out: Tensor, transpose_a: bool = False,
               transpose_b: bool = False) -> Tensor:
        """out = op(a) op(b), op the transpose where asked."""


#: ``allreduce(flat, average, what)``: the face's in-place core allreduce of ``flat`` over all ranks: the average
#: when ``average``, else the sum; ``what`` names the call ("dense", "P" or "Q").
Allreduce = Callable[[Tensor, bool, str], None]


@dataclasses.dataclass
class PowerSGDState:
    """Everything PowerSGD keeps between steps, per bucket index (torch's ``PowerSGDState`` without its process
    group): the error feedback, the P and Q memories (warm start), the step count and the seed stream, and the
    factor (a loss scale) that the gradients the errors came from carried."""

    options: PowerSGDOptions
    iter: int = 0
    error_scale: float = 1.0
    errors: dict[int, Tensor] = dataclasses.field(default_factory=dict)
    p_memory: dict[int, Tensor] = dataclasses.field(default_factory=dict)
    q_memory: dict[int, Tensor] = dataclasses.field(default_factory=dict)
    rng: np.random.RandomState = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.rng is None:
            self.rng = np.random.RandomState(self.options.random_seed)

    @property
    def compressing(self) -> bool:
        """Whether this step compresses (torch's hook: from step ``start_powerSGD_iter`` on, counting from 0)."""
        return self.iter >= self.options.start_powerSGD_iter

    def step_done(self) -> None:
        """After every bucket of a step (torch's ``maybe_increase_iter`` on the last bucket)."""
        self.iter += 1

    def scale_errors(self, scale: float, mul_: Callable[[Tensor, float], Any]) -> None:
        """The coming step's gradients carry the factor ``scale`` (a loss scaler's, where a face reduces them before
        they are unscaled): bring the errors, kept in the units of the step they came from, to it (``mul_(x, f)``
        multiplies in place), so that Alg. 2 line 3 adds what the last step left out and not that times the ratio
        of two scales. A scaler's scale changes by powers of two: exact."""
        if scale != self.error_scale:
            for error in self.errors.values():
                mul_(error, scale / self.error_scale)
            self.error_scale = scale

    def reset_error_feedback(self) -> None:
        """Start this rank's error from zero (a checkpoint of another rank's); P, Q and the step stay, which every
        rank shares."""
        self.errors.clear()

    def state_dict(self, clone: Callable[[Tensor], Tensor]) -> dict[str, Any]:
        """A picklable copy (``clone`` copies one tensor) that ``load_state_dict`` restores bit for bit."""
        return {
            "options": dataclasses.asdict(self.options),
            "iter": self.iter,
            "error_scale": self.error_scale,
            "rng": _rng_state(self.rng),
            "errors": {k: clone(v) for k, v in self.errors.items()},
            "p_memory": {k: clone(v) for k, v in self.p_memory.items()},
            "q_memory": {k: clone(v) for k, v in self.q_memory.items()},
        }

    def check_state_dict(self, saved: Any, sizes: Sequence[int], numel: Callable[[Tensor], int]) -> None:
        """ValueError unless ``saved`` is a ``state_dict()`` of PowerSGD with these options over buckets of
        ``sizes`` elements (checked before anything is changed)."""
        want = dataclasses.asdict(self.options)
        if not isinstance(saved, dict) or saved.get("options") != want:
            got = saved.get("options") if isinstance(saved, dict) else saved
            raise ValueError(f"load_state_dict: the checkpoint's PowerSGD options are {got!r}; this optimizer has "
                             f"{want!r}")
        for key in ("errors", "p_memory", "q_memory"):
            for index in saved[key]:
                if not 0 <= index < len(sizes):
                    raise ValueError(f"load_state_dict: the checkpoint's PowerSGD {key} has bucket {index}; this "
                                     f"optimizer has {len(sizes)} bucket(s)")
        for index, error in saved["errors"].items():
            if numel(error) != sizes[index]:
                raise ValueError(f"load_state_dict: the checkpoint's PowerSGD error of bucket {index} has "
                                 f"{numel(error)} elements; this optimizer's bucket has {sizes[index]}")

    def load_state_dict(self, saved: dict[str, Any], copy: Callable[[int, Tensor], Tensor]) -> None:
        """Restore a checked ``state_dict()``; ``copy(bucket, tensor)`` makes this face's tensor of a saved one, on
        that bucket's device."""
        self.iter = int(saved["iter"])
        self.error_scale = float(saved.get("error_scale", 1.0))
        name, keys, pos, has_gauss, cached = saved["rng"]
        self.rng = np.random.RandomState()
        self.rng.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
        self.errors = {k: copy(k, v) for k, v in saved["errors"].items()}
        self.p_memory = {k: copy(k, v) for k, v in saved["p_memory"].items()}
        self.q_memory = {k: copy(k, v) for k, v in saved["q_memory"].items()}


def _rng_state(rng: np.random.RandomState) -> tuple[str, list[int], int, int, float]:
    """The seed stream's state as plain Python values (a checkpoint that ``torch.load(weights_only=True)`` reads)."""
    name, keys, pos, has_gauss, cached = rng.get_state(legacy=True)
    return str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)


def reduce_bucket(xp: MatrixBackend, state: PowerSGDState, index: int, flat: Tensor,
                  shapes: Sequence[Sequence[int]], allreduce: Allreduce) -> None:
    """Reduce bucket ``index`` (the flat ``flat`` holding parameters of ``shapes``, in place) for this step; call
    ``state.step_done()`` once every bucket of the step is reduced.

    A result with an inf or NaN (a gradient with one on any rank: every rank holds the same result, so every rank
    sees it) is left in ``flat`` for the wrapped optimizer or the loss scaler to refuse, and the bucket's error, P,
    Q and the seed stream stay as they were: torch's hook keeps them, so under a ``GradScaler`` one overflow turns
    every later step into NaN and the scaler skips them all while the loss still looks normal.

    A matrix whose gradient is all zero on every rank (a layer not yet unfrozen, a branch unused this step) gets a
    zero result and keeps the Q it started from. In torch's hook its P is 0 / 0 (NaN in every later step) with
    ``orthogonalization_epsilon=0``; with an epsilon its Q memory becomes zero, and P = M Q stays zero once the
    layer trains: its gradient is zero for the rest of the run. Where no column is zero, torch's bits."""
    if not state.compressing:
        allreduce(flat, True, "dense")
        return
    opt = state.options
    if opt.use_error_feedback and index in state.errors:  # Alg. 2 line 3
        xp.add_(flat, state.errors[index])
    # The work runs in a buffer of its own, as torch's hook runs it in DDP's bucket buffer: a BLAS product's rounding
    # can depend on where its matrix starts in memory (MKL's matrix-vector product at r = 1 does), and ``flat`` may
    # start anywhere in a fused buffer. ``flat`` keeps M for the error.
    work = xp.clone(flat)
    offsets = np.concatenate([[0], np.cumsum([int(np.prod(s, dtype=np.int64)) for s in shapes])]).tolist()
    tensors = [xp.view(work, offsets[i], shape) for i, shape in enumerate(shapes)]
    plan = plan_bucket(shapes, opt)
    dense = [tensors[i] for i in plan.dense]
    if dense:
        packed = xp.cat(dense, work)
        allreduce(packed, True, "dense")
        xp.split_(packed, dense)
    # As torch's hook: every bucket without a previous Q allocates P and Q (empty when nothing in it is compressed)
    # and draws its seed, so the seeds of later buckets do not depend on which buckets hold a matrix.
    fresh = not opt.warm_start or index not in state.p_memory
    if fresh:
        rng_before = state.rng.get_state()
        state.p_memory[index] = xp.empty_like(plan.p_size, work)
        state.q_memory[index] = xp.empty_like(plan.q_size, work)
    p_flat, q_flat = state.p_memory[index], state.q_memory[index]
    ms = [xp.view(work, offsets[c.index], (c.rows, c.cols)) for c in plan.compressed]
    ps = [xp.view(p_flat, c.p_offset, (c.rows, c.rank)) for c in plan.compressed]
    qs = [xp.view(q_flat, c.q_offset, (c.cols, c.rank)) for c in plan.compressed]
    if fresh:  # Alg. 1 line 1 without a previous Q
        xp.randn_(int(state.rng.randint(_SEED_BOUND)), qs)
    # P and Q are worked on in place: (rows + cols) r numbers per matrix to keep.
    p_before, q_before = xp.clone(p_flat), xp.clone(q_flat)

    def restore() -> None:  # P, Q and the seed stream as before this bucket
        if fresh:
            del state.p_memory[index], state.q_memory[index]
            state.rng.set_state(rng_before)
        else:
            xp.split_(p_before, [p_flat])
            xp.split_(q_before, [q_flat])

    if plan.compressed:
        try:  # a collective refused (by any rank, on every rank alike) leaves the state as it was
            for q in qs:
                xp.orthogonalize_(q, opt.orthogonalization_epsilon)
            for m, q, p in zip(ms, qs, ps, strict=True):
                xp.matmul(m, q, out=p)  # Alg. 1 line 3
            allreduce(p_flat, False, "P")  # line 4: the sum (orthogonalization makes the scale irrelevant)
            for p in ps:
                xp.orthogonalize_(p, opt.orthogonalization_epsilon)  # line 5
            for m, p, q in zip(ms, ps, qs, strict=True):
                xp.matmul(m, p, out=q, transpose_a=True)  # line 6
            allreduce(q_flat, True, "Q")  # line 7
        except BaseException:
            restore()
            raise
        for p, q, m in zip(ps, qs, ms, strict=True):
            xp.matmul(p, q, out=m, transpose_b=True)  # line 8
    # An inf/NaN in any rank's M reaches every rank's Q (through P's sum) or the dense average: checking those
    # two reads (rows + cols) r numbers per matrix and the small tensors, not the bucket.
    finite = (not dense or xp.all_finite(packed)) and (not plan.compressed or xp.all_finite(q_flat))
    if not finite:
        restore()
        xp.split_(work, [flat])
        return
    for c, q in zip(plan.compressed, qs, strict=True):
        xp.keep_if_zero_column_(q, xp.view(q_before, c.q_offset, (c.cols, c.rank)))
    if opt.use_error_feedback:
        state.errors[index] = xp.sub(flat, work)  # Alg. 2 line 5
    xp.split_(work, [flat])
    if not opt.warm_start:
        state.p_memory.clear()
        state.q_memory.clear()
