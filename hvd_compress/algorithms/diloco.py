"""DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", arXiv 2311.08105)
and Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping communication", arXiv 2501.18512).

The papers' text is not in shared/papers; the rules below are the ones issue 59 states from them, each named by the
paper's algorithm it belongs to:

- DiLoCo, Algorithm 1: every rank runs H (``sync_every``) steps of its own inner optimizer on its own data (the
  wrapped optimizer, any); then the outer gradient Delta = theta_synced - theta_local is averaged over the ranks and
  an outer SGD with Nesterov momentum (``outer_lr`` 0.7, ``outer_momentum`` 0.9, ``nesterov``, the paper's
  defaults) steps theta_synced on it; every rank restarts its inner steps from the new theta_synced.
- Streaming DiLoCo, Section 2.2 (streaming partial updates): the parameters are cut into P (``fragments``) strided
  groups (parameter i in fragment i mod P); fragment p is synced every H steps, at step offsets spread evenly over
  the H steps (``sync_offset``), so the bytes of one sync are 1/P of the model's.
- Section 2.3 (overlapping communication): the average of a fragment's outer gradient runs in the background while
  tau (``sync_delay``) more inner steps go on; then the fragment's parameters become
  (1 - alpha) theta_global + alpha theta_local (``mix`` alpha) of the new global and the local parameters as they
  are tau steps later.
- Section 2.4 (quantized outer gradients): ``outer_compression`` fp16 or bf16 sends the outer gradient rounded to
  16 bits (round to nearest even), int8 or int4 in blocks of 64 with a float32 scale each (the core's
  block-quantized allreduce, format in cpp/include/hvdc/elementwise/block_quant.h); each rank's chunk of the sum is
  reduced in float32 and re-quantized once, and the quantization error of each rank's send is carried to the next
  sync of that fragment (error feedback).

Everything runs on the host in float32, whatever device and dtype the parameters have: the synced copy, the outer
momentum and the error feedback of each fragment are NumPy arrays in one ``DiLoCoState``, the same on every rank
(but the error feedback), so a checkpoint resumes at another rank count. The face only reads a fragment's parameters
into a float32 host array and writes one back (``FragmentIO``); it may replace the outer SGD by an optimizer of its
framework (``OuterOptimizer``) and give buffers (BatchNorm's statistics) to average at each merge. The rule line by
line: docs/algorithms/diloco.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hvd_compress import ops
from hvd_compress.algorithms import contract
from hvd_compress.algorithms.agreement import with_details
from hvd_compress.ops import runtime
from hvd_compress.ops.block_quant import BITS, block_quant_allreduce_
from hvd_compress.ops.compression import Compressor, compressed_allreduce_
from hvd_compress.ops.constants import AlgorithmOp, ReduceOp
from hvd_compress.ops.traffic import CommMeter

#: The wire formats of the outer gradient (``outer_compression``).
OUTER_COMPRESSIONS = ("none", "fp16", "bf16", "int8", "int4")


def _integer(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float, np.number)) and not isinstance(x, bool) and math.isfinite(float(x))


@dataclasses.dataclass(frozen=True)
class DiLoCoOptions:
    """DiLoCo's options (defaults: DiLoCo's, Section 3; ``fragments=1``, ``sync_delay=0``: plain DiLoCo)."""

    sync_every: int = 500
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    fragments: int = 1
    sync_delay: int = 0
    mix: float = 0.0
    outer_compression: str = "none"

    def validate(self, op_name: str) -> None:
        if not _integer(self.sync_every) or self.sync_every < 1:
            raise ValueError(f"op={op_name}: sync_every must be an int >= 1, got {self.sync_every!r}")
        if not _number(self.outer_lr) or not self.outer_lr > 0:
            raise ValueError(f"op={op_name}: outer_lr must be a finite number > 0, got {self.outer_lr!r}")
        if not _number(self.outer_momentum) or not 0 <= self.outer_momentum < 1:
            raise ValueError(f"op={op_name}: outer_momentum must be a number in [0, 1), got {self.outer_momentum!r}")
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"op={op_name}: nesterov must be True or False, got {self.nesterov!r}")
        if not _integer(self.fragments) or not 1 <= self.fragments <= self.sync_every:
            raise ValueError(f"op={op_name}: fragments must be an int in [1, sync_every={self.sync_every}] (each "
                             f"fragment syncs at its own step of every sync_every), got {self.fragments!r}")
        if not _integer(self.sync_delay) or not 0 <= self.sync_delay < self.sync_every:
            raise ValueError(f"op={op_name}: sync_delay must be an int in [0, sync_every={self.sync_every}) (a "
                             f"fragment's average must land before its next sync), got {self.sync_delay!r}")
        if not _number(self.mix) or not 0 <= self.mix < 1:
            raise ValueError(f"op={op_name}: mix must be a number in [0, 1), got {self.mix!r}")
        if self.outer_compression not in OUTER_COMPRESSIONS:
            raise ValueError(f"op={op_name}: outer_compression must be one of {list(OUTER_COMPRESSIONS)}, got "
                             f"{self.outer_compression!r}")


class DiLoCo:
    """The declaration the faces build ``op=DiLoCo`` from (``algorithms.contract``): local steps of any wrapped
    optimizer, fragments of the parameters synced on a schedule (``local``)."""

    name = "DiLoCo"
    options_cls = DiLoCoOptions
    op = AlgorithmOp("DiLoCo", 23)
    buffers = "local"
    wraps = contract.ANY


def fragment_members(count: int, fragments: int) -> list[list[int]]:
    """The parameter indices (in the wrapped optimizer's order) of each fragment: strided, parameter i in fragment
    i mod P (Streaming DiLoCo, Section 2.2: fragments interleave over the depth of the model)."""
    return [list(range(f, count, fragments)) for f in range(fragments)]


def sync_offset(fragment: int, options: DiLoCoOptions) -> int:
    """The step (mod H) at which ``fragment`` starts its sync: (p + 1) H / P rounded down, mod H, so the P fragments
    sync at evenly spread steps and the last at every H-th step (P = 1: DiLoCo's schedule)."""
    return (fragment + 1) * options.sync_every // options.fragments % options.sync_every


def starts_sync(step: int, fragment: int, options: DiLoCoOptions) -> bool:
    """Whether ``fragment`` starts a sync after inner step ``step`` (counted from 1)."""
    return step >= 1 and step % options.sync_every == sync_offset(fragment, options)


def outer_step(synced: np.ndarray, momentum: np.ndarray, gradient: np.ndarray, options: DiLoCoOptions) -> None:
    """DiLoCo Algorithm 1's OuterOpt: SGD with (Nesterov) momentum on the averaged outer gradient, in place, in
    float32, in torch.optim.SGD's order of operations (dampening 0): buf = mu buf + g; with Nesterov the step is
    g + mu buf, else buf; theta -= lr step."""
    mu = np.float32(options.outer_momentum)
    momentum *= mu
    momentum += gradient
    update = gradient + mu * momentum if options.nesterov else momentum
    synced -= np.float32(options.outer_lr) * update


def merge(synced: np.ndarray, local: np.ndarray, mix: float) -> np.ndarray:
    """Streaming DiLoCo Section 2.3: (1 - alpha) theta_global + alpha theta_local (alpha = 0: the global alone)."""
    if mix == 0:
        return synced.copy()
    return np.float32(1 - mix) * synced + np.float32(mix) * local


def round_to_wire(x: np.ndarray, kind: str) -> np.ndarray:
    """``x`` (float32) rounded to the outer gradient's wire format and back to float32, to nearest even: what the
    core's 16-bit cast sends of it."""
    if kind == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32)
    return x.copy()


class OuterOptimizer(Protocol):
    """An outer optimizer of the user's in place of ``outer_step`` (DiLoCo Algorithm 1's OuterOpt, any): a face
    wraps its framework's optimizer over host float32 copies of the synced parameters. Its state is the same on
    every rank (each steps the same synced copy on the same average), so it travels in DiLoCo's checkpoint."""

    name: str  # what it is, in each sync's call signature: ranks whose outer optimizers differ raise MismatchError

    def step(self, fragment: int, synced: np.ndarray, gradient: np.ndarray) -> None:
        """Step ``fragment``'s synced copy (float32, in place) on its averaged outer gradient."""

    def state_dict(self) -> Any:
        """A copy of its state, as the face saves it."""

    def load_state_dict(self, saved: Any) -> None:
        """Restore a ``state_dict()``."""


class FragmentIO(Protocol):
    """What a face gives DiLoCo: a fragment's parameters as one float32 host array, and back."""

    def read(self, fragment: int) -> np.ndarray:
        """A new float32 array of ``fragment``'s parameters one after the other."""

    def write(self, fragment: int, values: np.ndarray) -> None:
        """Set ``fragment``'s parameters from the float32 array ``values`` (cast to their dtype and device)."""


@dataclasses.dataclass
class DiLoCoState:
    """All of DiLoCo's state: the inner step count, per fragment the synced copy theta_synced, the outer momentum
    and the error feedback (float32, host), and the averaged outer gradients of syncs started but not merged yet
    (``averaged``: fragment -> (step the sync started, the average)). None until the first step takes the synced
    copy (after the user's broadcast of the parameters). Everything but the error feedback is the same on every
    rank. With an outer optimizer of the user's (``DiLoCoSync(outer=...)``), ``momentum`` is None: that optimizer
    holds its own state, which ``DiLoCoSync.state_dict`` saves beside this one."""

    options: DiLoCoOptions
    step: int = 0
    synced: list[np.ndarray] | None = None
    momentum: list[np.ndarray] | None = None
    error: list[np.ndarray] | None = None
    averaged: dict[int, tuple[int, np.ndarray]] = dataclasses.field(default_factory=dict)

    def state_dict(self, export: Callable[[np.ndarray], Any]) -> dict[str, Any]:
        """A picklable copy; ``export`` turns a float32 array into the face's saved tensor."""
        def arrays(xs: list[np.ndarray] | None) -> list[Any] | None:
            return None if xs is None else [export(x.copy()) for x in xs]

        return {
            "options": dataclasses.asdict(self.options),
            "step": self.step,
            "synced": arrays(self.synced),
            "momentum": arrays(self.momentum),
            "error": arrays(self.error),
            "averaged": {int(f): [int(s), export(a.copy())] for f, (s, a) in self.averaged.items()},
        }

    def check_state_dict(self, saved: Any, sizes: Sequence[int], load: Callable[[Any], np.ndarray],
                         outer: str | None = None) -> None:
        """ValueError unless ``saved`` is a ``state_dict()`` of DiLoCo with these options and outer optimizer
        (``outer``: its name, None for the built-in one) over fragments of ``sizes`` elements (checked before
        anything changes)."""
        want = dataclasses.asdict(self.options)
        if not isinstance(saved, dict) or saved.get("options") != want:
            got = saved.get("options") if isinstance(saved, dict) else saved
            raise ValueError(f"load_state_dict: the checkpoint's DiLoCo options are {got!r}; this optimizer has "
                             f"{want!r}")
        if not _integer(saved.get("step")) or saved["step"] < 0:
            raise ValueError(f"load_state_dict: the checkpoint's DiLoCo step is {saved.get('step')!r}")
        if saved.get("outer_name") != outer:
            raise ValueError(f"load_state_dict: the checkpoint's DiLoCo outer optimizer is "
                             f"{saved.get('outer_name') or 'the built-in one'}; this optimizer's is "
                             f"{outer or 'the built-in one'}")
        for key in ("synced", "momentum", "error"):
            xs = saved.get(key)
            if xs is None:
                if key == "momentum" and outer is None and saved.get("synced") is not None:
                    raise ValueError(f"load_state_dict: the checkpoint's DiLoCo state has synced but no {key}")
                continue
            got = [load(x).size for x in xs]
            if got != list(sizes):
                raise ValueError(f"load_state_dict: the checkpoint's DiLoCo {key} has fragments of {got} elements; "
                                 f"this optimizer's have {list(sizes)}")
        for f, (start, avg) in saved.get("averaged", {}).items():
            if not 0 <= int(f) < len(sizes) or load(avg).size != sizes[int(f)] or int(start) > saved["step"]:
                raise ValueError(f"load_state_dict: the checkpoint's DiLoCo sync of fragment {f} (started at step "
                                 f"{start}) does not fit this optimizer's {len(sizes)} fragments of {list(sizes)}")

    def load_state_dict(self, saved: dict[str, Any], load: Callable[[Any], np.ndarray]) -> None:
        """Restore a checked ``state_dict()``; ``load`` turns a saved tensor into a new float32 array."""
        def arrays(xs: list[Any] | None) -> list[np.ndarray] | None:
            return None if xs is None else [load(x) for x in xs]

        self.step = int(saved["step"])
        self.synced = arrays(saved["synced"])
        self.momentum = arrays(saved["momentum"])
        self.error = arrays(saved.get("error"))
        if self.synced is not None and self.options.outer_compression != "none" and self.error is None:
            self.error = [np.zeros_like(x) for x in self.synced]
        self.averaged = {int(f): (int(s), load(a)) for f, (s, a) in saved.get("averaged", {}).items()}


def _load_f32(x: Any) -> np.ndarray:
    return np.array(x, dtype=np.float32).reshape(-1)


class DiLoCoSync:
    """DiLoCo's schedule over one ``DiLoCoState``: the face calls ``begin_step()`` before each inner step of the
    wrapped optimizer and ``end_step()`` after it; syncs start and end there, in the same order on every rank."""

    def __init__(self, options: DiLoCoOptions, sizes: Sequence[int], io: FragmentIO, meter: CommMeter,
                 name: str = "DistributedOptimizer.diloco", outer: OuterOptimizer | None = None,
                 buffers: FragmentIO | None = None) -> None:
        self.options = options
        self.outer = outer
        self.buffers = buffers
        self.sizes = [int(s) for s in sizes]
        self.io = io
        self.meter = meter
        self.name = name
        self.state = DiLoCoState(options)
        # Syncs in flight: fragment -> (start step, future, the array averaged in place, a copy of it as sent, the
        # error array the core updates for int8/int4).
        self.inflight: dict[int, tuple[int, concurrent.futures.Future, np.ndarray, np.ndarray, Any]] = {}

    # -- the schedule ------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before an inner step: the first one takes theta_synced from the parameters (broadcast by then)."""
        st = self.state
        if st.synced is None:
            st.synced = [self.io.read(f) for f in range(self.options.fragments)]
            st.momentum = [np.zeros_like(x) for x in st.synced] if self.outer is None else None
            st.error = [np.zeros_like(x) for x in st.synced] if self.options.outer_compression != "none" else None

    def end_step(self) -> None:
        """After an inner step: merge the syncs that started ``sync_delay`` steps ago, then start the due ones."""
        st = self.state
        st.step += 1
        merged = False
        for f in sorted(set(self.inflight) | set(st.averaged)):
            start = self.inflight[f][0] if f in self.inflight else st.averaged[f][0]
            if start + self.options.sync_delay <= st.step:
                self._finish(f)
                merged = True
        for f in range(self.options.fragments):
            if starts_sync(st.step, f, self.options):
                self._start(f)
                if self.options.sync_delay == 0:
                    self._finish(f)
                    merged = True
        if merged and self.buffers is not None:
            self._average_buffers()

    def _average_buffers(self) -> None:
        """The face's buffers (BatchNorm's running statistics: state the forward pass updates, not the optimizer)
        averaged in float32 at every step that merges a fragment, so that the model the ranks evaluate right
        after a merge is the same on every rank. They are averaged as they are, not stepped by the outer
        optimizer: they are estimates of the data's statistics, not parameters."""
        values = self.buffers.read(0)
        if values.size:
            name = with_details(f"{self.name}.buffers", {"op": "DiLoCo", "step": self.state.step})
            self.meter.run(ops.allreduce_, values, op=ReduceOp.Average, name=name)
            self.buffers.write(0, values)

    def _start(self, f: int) -> None:
        """Streaming DiLoCo Section 2.3: the outer gradient of fragment ``f`` now, averaged in the background."""
        st = self.state
        delta = st.synced[f] - self.io.read(f)  # DiLoCo Algorithm 1: Delta = theta_synced - theta_local
        kind = self.options.outer_compression
        if kind in ("fp16", "bf16"):  # Section 2.4: send the error-compensated delta rounded; keep what rounding lost
            compensated = delta + st.error[f]
            delta = round_to_wire(compensated, kind)
            st.error[f] = compensated - delta
        name = self._call_name(f, st.step)
        if self.options.sync_delay == 0:
            self.meter.run(self._average, delta, f, name)
            st.averaged[f] = (st.step, delta)
        else:  # the int8/int4 error of fragment f is the core's to update until the merge
            # the core updates a copy of the error: the state's stays as before the sync until its merge
            sent, error = delta.copy(), None if st.error is None else st.error[f].copy()
            future = runtime.submit(self.meter.run, self._average, delta, f, name, error)
            self.inflight[f] = (st.step, future, delta, sent, error)

    def _call_name(self, f: int, start: int) -> str:
        """The call's name with the sync's step and DiLoCo's options as details: the core hashes them into the
        signature, so ranks whose schedules or options differ raise MismatchError on every rank instead of averaging
        the outer gradients of different steps."""
        details = {"op": "DiLoCo", "step": start, **dataclasses.asdict(self.options)}
        if self.outer is not None:
            details["outer"] = self.outer.name
        return with_details(f"{self.name}.{f}", details)

    def _average(self, delta: np.ndarray, f: int, name: str, error: np.ndarray | None = None) -> None:
        kind = self.options.outer_compression
        if kind == "none":
            # The dense allreduce takes any value; a NaN/inf on one rank would reach every rank's synced copy. The
            # compressed calls refuse them themselves (the core's input check).
            if not np.isfinite(delta).all():
                ops.reject_allreduce(f"op=DiLoCo: the outer gradient of fragment {f} is not finite on this rank "
                                     "(a NaN or inf in its parameters)", name)
            ops.allreduce_(delta, op=ReduceOp.Average, name=name)
        elif kind in BITS:  # error feedback inside the core's call: c = delta + error, error = c - sent
            error = self.state.error[f] if error is None else error
            block_quant_allreduce_(delta, BITS[kind], error, op=ReduceOp.Average, name=name)
        else:
            compressed_allreduce_(delta, Compressor(kind), op=ReduceOp.Average, name=name)

    def _wait(self, f: int) -> None:
        """The average of fragment ``f``'s sync in flight, waited for, kept in ``state.averaged``."""
        start, future, delta, _, error = self.inflight.pop(f)
        future.result()
        self.state.averaged[f] = (start, delta)
        if error is not None:  # the array the core updated (a face may have replaced the state's since)
            self.state.error[f] = error

    def _finish(self, f: int) -> None:
        """The outer step of fragment ``f`` on its averaged outer gradient, then the merge into the parameters."""
        if f in self.inflight:
            self._wait(f)
        st = self.state
        _, gradient = st.averaged.pop(f)
        if self.outer is None:
            outer_step(st.synced[f], st.momentum[f], gradient, self.options)
        else:
            self.outer.step(f, st.synced[f], gradient)
        self.io.write(f, merge(st.synced[f], self.io.read(f) if self.options.mix else st.synced[f],
                               self.options.mix))

    def average_now(self, f: int, start: int, sent: np.ndarray) -> None:
        """The average of a sync whose call this process never made (a face restored it from variables that hold
        what this rank sent, ``sent``): made now, on every rank alike, before its merge."""
        delta = np.array(sent, dtype=np.float32)
        self.meter.run(self._average, delta, f, self._call_name(f, start))
        self.state.averaged[f] = (start, delta)

    def wait_all(self) -> None:
        """Wait for every sync in flight (its average kept for its merge at its step)."""
        for f in sorted(self.inflight):
            self._wait(f)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self, export: Callable[[np.ndarray], Any]) -> dict[str, Any]:
        """The state, with the averages of syncs in flight waited for (every rank started them alike), and the
        outer optimizer's of the user's (``outer``, its ``state_dict()``)."""
        self.wait_all()
        out = self.state.state_dict(export)
        if self.outer is not None:
            out["outer_name"], out["outer"] = self.outer.name, self.outer.state_dict()
        return out

    def check_state_dict(self, saved: Any, load: Callable[[Any], np.ndarray] = _load_f32) -> None:
        """ValueError unless ``saved`` fits this optimizer (``DiLoCoState.check_state_dict``)."""
        self.state.check_state_dict(saved, self.sizes, load, None if self.outer is None else self.outer.name)

    def load_state_dict(self, saved: dict[str, Any], load: Callable[[Any], np.ndarray] = _load_f32) -> None:
        self.check_state_dict(saved, load)
        self.wait_all()  # a sync of the state being replaced still has to meet the other ranks' call
        self.state = DiLoCoState(self.options)
        self.state.load_state_dict(saved, load)
        if self.outer is not None and "outer" in saved:
            self.outer.load_state_dict(saved["outer"])

    def error_feedback(self) -> list[np.ndarray]:
        """This rank's error feedback per fragment (empty without outer compression or before the first step)."""
        return list(self.state.error or [])

    def reset_error_feedback(self) -> None:
        for e in self.error_feedback():
            e.fill(0)
