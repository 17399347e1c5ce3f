"""``hc.DistributedOptimizer``: Horovod's drop-in optimizer wrapper, on the hvd_compress core.

``op=hc.Average``/``hc.Sum`` reduce the gradients (one fused call per dtype) and then step the
wrapped optimizer, exactly like ``hvd.DistributedOptimizer``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops
from hvd_compress.ops.constants import DENSE_OPS, ReduceOp
from hvd_compress.torch.context import ensure_init
from hvd_compress.torch.functions import allreduce_
from hvd_compress.torch.fused import FusedGradients


class _DistributedMixin:
    """Methods added to the wrapped optimizer's class (as Horovod does, so isinstance still holds)."""

    def _hvdc_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None,
        op: ReduceOp,
        backward_passes_per_step: int,
    ) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in names]
            if missing:
                raise ValueError(
                    f"named_parameters does not name {len(missing)} parameter(s) of the optimizer "
                    f"(first at index {missing[0]})"
                )
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        self._hvdc_op = op
        self._hvdc_passes = backward_passes_per_step
        self._hvdc_grads = FusedGradients(params)
        self._hvdc_counts = {id(p): 0 for p in self._hvdc_grads.params}
        self._hvdc_bytes = {"bytes_sent": 0, "bytes_received": 0}
        self._hvdc_hooks = [
            p.register_post_accumulate_grad_hook(self._hvdc_count_pass) for p in self._hvdc_grads.params
        ]

    def _hvdc_count_pass(self, p: torch.Tensor) -> None:
        n = self._hvdc_counts[id(p)] + 1
        if n > self._hvdc_passes:
            raise RuntimeError(
                f"gradients were computed {n} times before step(); with backward_passes_per_step="
                f"{self._hvdc_passes} call step() (or synchronize()) every {self._hvdc_passes} backward passes"
            )
        self._hvdc_counts[id(p)] = n

    def synchronize(self) -> None:
        """Reduce the accumulated gradients over all ranks (step() calls this)."""
        ensure_init()
        self._hvdc_grads.gather()
        before = ops.comm_stats(reset=False)
        for i, flat in enumerate(self._hvdc_grads.buffers):
            allreduce_(flat, op=self._hvdc_op, name=f"DistributedOptimizer.grad.{i}")
        after = ops.comm_stats(reset=False)
        for k in self._hvdc_bytes:
            self._hvdc_bytes[k] += after[k] - before[k]
        for k in self._hvdc_counts:
            self._hvdc_counts[k] = 0

    def step(self, closure: Any = None) -> Any:
        self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fused gradient buffers in place (gradients stay views, never None)."""
        del set_to_none  # views must survive for the fused reduction
        self._hvdc_grads.zero_()

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        out = dict(self._hvdc_bytes)
        self._hvdc_bytes = {"bytes_sent": 0, "bytes_received": 0}
        return out


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
    op: Any = ReduceOp.Average,
    backward_passes_per_step: int = 1,
    **algorithm_options: Any,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` first reduces gradients over all ranks with ``op``.

    The result is an instance of a subclass of ``optimizer``'s class, built on the same
    ``param_groups`` and carrying over its state, so LR schedulers and ``state_dict()`` work.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown op {op!r}; use one of {[o.name for o in ReduceOp]}") from None
    if op not in DENSE_OPS:
        raise NotImplementedError(f"DistributedOptimizer(op={op.name}) is not available yet")
    if algorithm_options:
        raise TypeError(f"op={op.name} takes no algorithm options, got {sorted(algorithm_options)}")
    methods = {k: v for k, v in vars(_DistributedMixin).items() if not k.startswith("__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    state = optimizer.state_dict()
    wrapped = cls.__new__(cls)
    optimizer.__class__.__init__(wrapped, optimizer.param_groups, **_init_kwargs(optimizer))
    wrapped.load_state_dict(state)
    wrapped._hvdc_setup(named_parameters, op, backward_passes_per_step)
    return wrapped


def _init_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Constructor keywords that re-create ``optimizer``: its defaults (param groups carry the rest)."""
    accepted = inspect.signature(optimizer.__class__.__init__).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}
