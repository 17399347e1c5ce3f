"""``zero_grad()`` under ``hc.DistributedOptimizer``, as docs/migrating-from-horovod.md states it: under every op
``zero_grad()`` and ``zero_grad(set_to_none=True)`` set ``.grad`` to None as Horovod's wrapper does (whose
``zero_grad`` takes no ``set_to_none``), and ``set_to_none=False`` zeroes the fused views in place; either way the
steps that follow reach the same parameters, bit for bit. Real processes at 2 ranks, Horovod's wrapper beside hc's."""

from __future__ import annotations

import torch
from mpi_harness import load_ranks, mpirun

OPS = ("Average", "Sum", "Adasum", "OneBitAdam", "OneBitLamb", "SLAMB", "Birder")


def test_zero_grad_sets_none_as_horovod_unless_asked_not_to_and_trains_alike_either_way(out_dir) -> None:
    mpirun("zero_grad.py", 2, out_dir, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        got = rk["grads"]
        for form in ("default", "set_to_none=True", "set_to_none=False"):
            assert got[f"horovod {form}"] == ("None" if form == "default" else "TypeError"), f"rank {r}: {got}"
            want = "zero" if form == "set_to_none=False" else "None"
            for op in OPS:
                assert got[f"{op} {form}"] == want, f"rank {r} of 2, {op}, zero_grad({form}): {got[f'{op} {form}']}"
        for op in OPS:
            kept, cleared = rk["params"][f"{op} set_to_none=False"], rk["params"][f"{op} default"]
            assert all(torch.equal(a, b) for a, b in zip(kept, cleared, strict=True)), f"rank {r}, {op}"
            assert all(torch.equal(a, b) for a, b in zip(rk["params"][f"{op} set_to_none=True"], cleared,
                                                           strict=True)), f"rank {r}, {op}"
