"""The engine of ``hc.DistributedOptimizer(op=hc.PowerSGD)``: op=Average's buckets, each reduced by PowerSGD.

The rule, its state and its schedule are ``hvd_compress.algorithms.powersgd``; this module gives it torch's matrix
work (``TorchMatrices``: the same torch calls as torch's ``powerSGD_hook``, so both round alike) and the core's
allreduce, and keeps the one ``PowerSGDState`` in ``state_dict()``. Everything else (fused gradient buffers, buckets
reduced during backward with ``overlap``, ``synchronize()``, gradient accumulation) is ``DenseEngine``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hvd_compress.algorithms import powersgd
from hvd_compress.ops.buckets import failure_joins_as_rejection
from hvd_compress.ops.compression import Compression
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.dense import DenseEngine
from hvd_compress.torch.functions import allreduce_
from hvd_compress.torch.wrapping import STATE_KEY, own_section, unscaled


class TorchMatrices:
    """``powersgd.MatrixBackend`` as torch ops: batched products and orthogonalization on (1, n, r) views, as
    torch's hook computes them (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py)."""

    @staticmethod
    def empty_like(numel: int, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(numel, dtype=like.dtype, device=like.device)

    @staticmethod
    def clone(x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone()

    @staticmethod
    def add_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.add_(y)

    @staticmethod
    def mul_(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x.mul_(factor)

    @staticmethod
    def sub(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b

    @staticmethod
    def view(flat: torch.Tensor, offset: int, shape: Sequence[int]) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= int(n)
        return flat[offset : offset + numel].view(*shape)

    @staticmethod
    def cat(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors]) if tensors else like.new_empty(0)

    @staticmethod
    def split_(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    @staticmethod
    def all_finite(x: torch.Tensor) -> bool:
        return bool(torch.isfinite(x).all())

    @staticmethod
    def randn_(seed: int, outs: Sequence[torch.Tensor]) -> None:
        # torch's hook: manual_seed(seed), then one CPU randn per Q in order, copied to Q's device.
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for q in outs:
            q.copy_(torch.randn(1, *q.shape, generator=gen, dtype=q.dtype, device="cpu")[0])

    @staticmethod
    def orthogonalize_(x: torch.Tensor, epsilon: float) -> None:
        matrices = x.unsqueeze(0)
        rank = matrices.shape[2]
        if rank <= 2 or matrices.dtype in (torch.float16, torch.bfloat16):
            for i in range(rank):  # Gram-Schmidt, in torch's hook's order of operations
                col = matrices[:, :, i : i + 1]
                if epsilon == 0:  # a zero column stays zero, not 0 / 0
                    col /= torch.norm(col, dim=1, keepdim=True).clamp_min(torch.finfo(col.dtype).tiny)
                else:
                    col /= torch.norm(col, dim=1, keepdim=True) + epsilon
                if i + 1 < rank:
                    rest = matrices[:, :, i + 1 :]
                    rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
        else:
            r = torch.empty(1, rank, rank, device=x.device, dtype=x.dtype)
            torch.linalg.qr(matrices, out=(matrices, r))

    @staticmethod
    def keep_if_zero_column_(new: torch.Tensor, old: torch.Tensor) -> None:
        zero_column = (new == 0).all(dim=0).any()  # a device tensor: no wait for the GPU
        new.copy_(torch.where(zero_column, old, new))

    @staticmethod
    def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, transpose_a: bool = False,
               transpose_b: bool = False) -> torch.Tensor:
        a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
        torch.bmm(a3.transpose(1, 2) if transpose_a else a3, b3.transpose(1, 2) if transpose_b else b3,
                  out=out.unsqueeze(0))
        return out


class PowerSGDEngine(DenseEngine):
    """op=PowerSGD: the gradient buckets of op=Average, each reduced by PowerSGD, then the wrapped optimizer steps."""

    exports = ("overlap", "powersgd_state")

    def __init__(self, optimizer: torch.optim.Optimizer, base: type, named_parameters: Any, passes: int,
                 algorithm: type, options: powersgd.PowerSGDOptions, overlap: bool, bucket_mb: float) -> None:
        del algorithm  # powersgd.PowerSGD: the rule is this module's calls of hvd_compress.algorithms.powersgd
        # Sparse gradients (nn.Embedding(sparse=True)) stay op=Average's: gathered, not compressed.
        super().__init__(optimizer, base, named_parameters, ReduceOp.Average, passes, 1.0, False, Compression.none,
                         overlap, bucket_mb, None)
        self.state = powersgd.PowerSGDState(options)
        self.matrices = TorchMatrices()
        self.shapes: list[list[tuple[int, ...]]] = [[] for _ in self.buckets]
        for p in self.grads.params:  # in buffer order within each bucket
            self.shapes[self.bucket_of[id(p)]].append(tuple(p.shape))
        self._scaler: Any = None  # the GradScaler that handed itself to the last step() (scaler.step(opt)), or None

    def _step_starts(self) -> None:
        """Bring the errors to the units of the gradients this step reduces (``PowerSGDState.scale_errors``): under
        a GradScaler those reduced before ``step()`` unscales them (with overlap, during backward; or in an
        explicit ``synchronize()`` before ``scaler.unscale_``) carry its scale, which ``scaler.update()`` doubles
        or halves between steps; torch's hook adds the error in the old scale's units once after each change. The
        scaler is the one of the last ``scaler.step(opt)``: the first step of a process under one is labelled in
        ``step()``, after its reduction."""
        scaler = self._scaler
        if scaler is None:
            return
        scale = 1.0 if unscaled(scaler, self.opt) or not scaler.is_enabled() else float(scaler.get_scale())
        self.state.scale_errors(scale, self.matrices.mul_)

    def step(self, closure: Any = None, grad_scaler: Any = None) -> Any:
        """``DenseEngine.step``, noting the GradScaler (or its absence) for the units of the errors."""
        if self.reduced_in_step and self._scaler is None:
            # Reduced before this call with no scaler known then (``_scaler`` changes only here): in the units of
            # this scaler's scale, which its update() has not changed yet, or of the gradients themselves.
            scaled = grad_scaler is not None and grad_scaler.is_enabled()
            self.state.error_scale = float(grad_scaler.get_scale()) if scaled else 1.0
        self._scaler = grad_scaler
        return super().step(closure, grad_scaler)

    @property
    def op_name(self) -> str:
        return "PowerSGD"  # the buckets are reduced as op=Average's

    @property
    def powersgd_state(self) -> powersgd.PowerSGDState:
        """The PowerSGD state (errors, P and Q by bucket, ``iter``, the seed stream), torch's ``PowerSGDState``."""
        return self.state

    def _allreduce_bucket(self, index: int, tag: str) -> None:
        _, flat = self.buckets[index]
        name = f"DistributedOptimizer.powersgd.{index}{tag}"  # each of the bucket's calls; a failure joins the next

        def allreduce(tensor: torch.Tensor, average: bool, what: str) -> None:
            self.meter.run(allreduce_, tensor, op=ReduceOp.Average if average else ReduceOp.Sum, name=name)

        with failure_joins_as_rejection(self.meter, name), torch.no_grad():
            powersgd.reduce_bucket(self.matrices, self.state, index, flat, self.shapes[index], allreduce)

    def _synchronize_members(self) -> None:
        super()._synchronize_members()
        self.state.step_done()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state, plus this rank's PowerSGD state (``PowerSGDState.state_dict``); between
        a reduction and ``step()`` with a warning (``check_between_steps``)."""
        self.check_between_steps()
        out = self.base.state_dict(self.opt)
        out[STATE_KEY] = own_section({"powersgd": self.state.state_dict(lambda t: t.detach().clone())})
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (each rank its own: the error feedback is per rank). One without the PowerSGD
        section (a plain torch checkpoint) restarts PowerSGD from step 0 with no error and no warm start."""
        state_dict = dict(state_dict)
        section = state_dict.pop(STATE_KEY, None)
        ours = (section or {}).get("powersgd")
        if ours is not None:  # check everything before changing anything
            sizes = [flat.numel() for _, flat in self.buckets]
            self.state.check_state_dict(ours, sizes, lambda t: t.numel())
        self.base.load_state_dict(self.opt, state_dict)
        if ours is None:
            self.state = powersgd.PowerSGDState(self.state.options)
            return

        def copy(bucket: int, tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(device=self.buckets[bucket][1].device).clone()

        self.state.load_state_dict(ours, copy)
        self.drop_another_ranks_error_feedback(section, self.wrapper_name)

    def error_feedback(self) -> list[torch.Tensor]:
        return [self.state.errors[b] for b in sorted(self.state.errors)]

    def reset_error_feedback(self) -> None:
        self.state.reset_error_feedback()
