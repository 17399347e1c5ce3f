"""The engine of ``hc.DistributedOptimizer(op=hc.DiLoCo)``: each rank steps the wrapped optimizer on its own
gradients; fragments of the parameters are synced on DiLoCo's schedule.

The rule, its state and its schedule are ``hvd_compress.algorithms.diloco``; this module reads a fragment's
parameters into a float32 host array and writes one back (``TorchFragments``), so the synced copy and the outer
momentum stay off the GPU, and keeps the one ``DiLoCoState`` in ``state_dict()`` as CPU tensors (a checkpoint that
``torch.load(weights_only=True)`` reads).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hvd_compress.algorithms import diloco
from hvd_compress.ops.passes import PassCounter
from hvd_compress.ops.traffic import CommMeter
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.wrapping import STATE_KEY, Engine, check_named_parameters, closure_loss, own_section


class TorchFragments:
    """``diloco.FragmentIO`` over torch parameters: fragment f is ``members[f]``, in order."""

    def __init__(self, members: list[list[torch.nn.Parameter]]) -> None:
        self.members = members

    def read(self, fragment: int) -> np.ndarray:
        params = self.members[fragment]
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).to(device="cpu", dtype=torch.float32) for p in params])
        return flat.numpy()

    def write(self, fragment: int, values: np.ndarray) -> None:
        source = torch.from_numpy(values)
        offset = 0
        with torch.no_grad():
            for p in self.members[fragment]:
                p.copy_(source[offset : offset + p.numel()].view_as(p))
                offset += p.numel()


class TorchOuterOptimizer:
    """``diloco.OuterOptimizer`` over a torch optimizer of the user's (``outer_optimizer=``, a factory params ->
    Optimizer), made over host float32 tensors shaped as the parameters: at a sync of fragment f, its tensors take
    the synced copy, their ``.grad`` the averaged outer gradient, the optimizer steps (the other fragments' tensors
    have no gradient, so torch's optimizers leave them and their state alone), and the synced copy takes the
    result."""

    def __init__(self, factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
                 members: list[list[torch.nn.Parameter]]) -> None:
        if isinstance(factory, torch.optim.Optimizer) or not callable(factory):
            raise TypeError("op=DiLoCo: outer_optimizer must be a function of the parameters that returns a torch "
                            "optimizer over them (e.g. lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9, "
                            f"nesterov=True)), got {type(factory).__name__}: DiLoCo makes the parameters (host "
                            "float32 copies of the synced model)")
        self.params = [[torch.zeros(p.shape, dtype=torch.float32) for p in m] for m in members]
        flat = [p for m in self.params for p in m]
        opt = factory(list(flat))
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"op=DiLoCo: outer_optimizer(params) must return a torch.optim.Optimizer, got "
                            f"{type(opt).__name__}")
        theirs = [p for g in opt.param_groups for p in g["params"]]
        if len(theirs) != len(flat) or {id(p) for p in theirs} != {id(p) for p in flat}:
            raise ValueError("op=DiLoCo: outer_optimizer(params) must return an optimizer over exactly the params "
                             f"it is given ({len(flat)} tensors), got one over {len(theirs)} other or more tensors")
        self.opt = opt
        self.name = f"{type(opt).__module__}.{type(opt).__qualname__}"

    def step(self, fragment: int, synced: np.ndarray, gradient: np.ndarray) -> None:
        with torch.no_grad():
            for m in self.params:
                for p in m:
                    p.grad = None
            offset, source, grad = 0, torch.from_numpy(synced), torch.from_numpy(gradient)
            for p in self.params[fragment]:
                p.copy_(source[offset : offset + p.numel()].view_as(p))
                p.grad = grad[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
            self.opt.step()
            offset = 0
            for p in self.params[fragment]:
                source[offset : offset + p.numel()] = p.reshape(-1)
                p.grad = None
                offset += p.numel()

    def state_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.opt.state_dict())

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.opt.load_state_dict(saved)


def _buffers(buffers: Any) -> TorchFragments | None:
    """``buffers=`` (e.g. ``model.buffers()``) as one fragment of its floating-point tensors: those DiLoCo averages
    at each merge. Integer buffers (BatchNorm's ``num_batches_tracked``) count the same steps on every rank."""
    if buffers is None:
        return None
    if isinstance(buffers, torch.Tensor) or not hasattr(buffers, "__iter__"):
        raise TypeError(f"op=DiLoCo: buffers must be an iterable of tensors (e.g. model.buffers()), got "
                        f"{type(buffers).__name__}")
    found = list(buffers)
    bad = [type(b).__name__ for b in found if not isinstance(b, torch.Tensor)]
    if bad:
        raise TypeError(f"op=DiLoCo: buffers must be tensors (e.g. model.buffers()), got {bad[0]}")
    floating = [b for b in found if b.is_floating_point()]
    return TorchFragments([floating]) if floating else None


def _export(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


def _load(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float32).reshape(-1).numpy().copy()
    return np.array(x, dtype=np.float32).reshape(-1)


class DiLoCoEngine(Engine):
    """op=DiLoCo: no gradient reduction; ``step()`` is the wrapped optimizer's step on this rank's gradients, then
    DiLoCo's schedule (``DiLoCoSync.end_step``). ``synchronize()`` has nothing to reduce."""

    exports = ("diloco_state", "wait_for_syncs")
    frozen_later_ok = True  # a frozen parameter gets no gradient, so no inner step: it stays, as under torch

    def __init__(self, optimizer: torch.optim.Optimizer, base: type, named_parameters: Any, passes: int,
                 algorithm: type, options: diloco.DiLoCoOptions,
                 outer_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
                 buffers: Any = None) -> None:
        del algorithm  # diloco.DiLoCo: the rule is hvd_compress.algorithms.diloco
        super().__init__(optimizer, base)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        check_named_parameters(params, named_parameters)
        if len(params) < options.fragments:
            raise ValueError(f"op=DiLoCo: fragments={options.fragments} but the optimizer has {len(params)} "
                             "trainable parameter(s); every fragment needs one at least")
        members = [[params[i] for i in m] for m in diloco.fragment_members(len(params), options.fragments)]
        self.meter = CommMeter()
        self.passes = PassCounter(params, passes)  # gradients accumulate in .grad as torch's do: nothing to count
        outer = None if outer_optimizer is None else TorchOuterOptimizer(outer_optimizer, members)
        self.sync = diloco.DiLoCoSync(options, [sum(p.numel() for p in m) for m in members],
                                      TorchFragments(members), self.meter, outer=outer,
                                      buffers=_buffers(buffers))

    @property
    def diloco_state(self) -> diloco.DiLoCoState:
        """DiLoCo's state: the step count, per fragment the synced copy, the outer momentum and the error feedback
        (float32 NumPy arrays on the host)."""
        return self.sync.state

    def wait_for_syncs(self) -> None:
        """Wait for the averages of the syncs in flight (``sync_delay``); they are still merged at their step."""
        self.sync.wait_all()

    def synchronize(self) -> None:
        """Nothing to reduce: each rank's gradients are its own in DiLoCo (Horovod's protocol kept)."""
        self.protocol.mark_synchronized()

    def step(self, closure: Any = None) -> Any:
        loss = closure_loss(closure)
        ensure_init()
        self.protocol.step_done()
        self.sync.begin_step()
        self.base.step(self.opt)
        with torch.no_grad():
            self.sync.end_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(self.opt, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state (this rank's own) and DiLoCo's (``DiLoCoState``, the same on every rank but
        its error feedback), the averages of syncs in flight waited for."""
        out = self.base.state_dict(self.opt)
        out[STATE_KEY] = own_section({"diloco": self.sync.state_dict(_export)})
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` of any rank count (DiLoCo's state is the same on every rank). One without
        DiLoCo's section (a plain torch checkpoint) starts DiLoCo afresh: its synced copy is taken at the next
        step."""
        state_dict = dict(state_dict)
        section = state_dict.pop(STATE_KEY, None)
        ours = (section or {}).get("diloco")
        if ours is not None:
            self.sync.check_state_dict(ours, _load)
        self.base.load_state_dict(self.opt, state_dict)
        if ours is None:
            self.sync.wait_all()
            self.sync.state = diloco.DiLoCoState(self.sync.options)
            return
        self.sync.load_state_dict(ours, _load)
        self.drop_another_ranks_error_feedback(section, "DistributedOptimizer", "outer error feedback")

    def error_feedback(self) -> list[torch.Tensor]:
        return [torch.from_numpy(e) for e in self.sync.error_feedback()]

    def per_rank_what(self) -> str | None:
        """The wrapped optimizer's state (each rank steps on its own gradients) and the outer error feedback."""
        return "optimizer state (each rank steps on its own gradient)" if self.opt.state or \
            self.sync.error_feedback() else None

    def per_rank_fallback(self, root: int) -> str:
        return f"takes rank {root}'s inner optimizer state and starts its outer error feedback from zero"

