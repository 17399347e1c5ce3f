"""The wrapped optimizer of every op is one subclass of the user's optimizer class whose only added attribute is the
engine (``_hvdc``) and whose class adds only the delegates of ``wrapping.COMMON`` and the engine's ``exports``:
isinstance, LR schedulers and state_dict() keep working, ranks agree, and dropping the optimizer frees the engine."""

from __future__ import annotations

import torch
from mpi_harness import load_ranks, mpirun


def test_every_op_wraps_into_one_delegating_subclass_holding_one_engine(out_dir) -> None:
    mpirun("wrapped_optimizer.py", 2, out_dir, timeout=240)
    ranks = load_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for name, got in rk.items():
            where = f"rank {r} op={name}"
            assert got["instance_names"] == ["_hvdc"], f"{where}: instance attributes added {got['instance_names']}"
            extra = sorted(set(got["class_names"]) - set(got["allowed"]))
            assert not extra, f"{where}: the class adds {extra} beyond the delegates"
            assert not [n for n in got["class_names"] if n.startswith("_hvdc")], f"{where}: {got['class_names']}"
            assert got["is_user_class"] and len(got["bases"]) == 1, f"{where}: bases {got['bases']}"
            assert got["lr"] == got["lr0"] * 0.5**3, f"{where}: StepLR left lr at {got['lr']}, from {got['lr0']}"
            assert got["reloaded_lr"] == got["lr"], f"{where}: state_dict() carried lr {got['reloaded_lr']}"
            assert got["engine_freed"], f"{where}: the engine outlived the optimizer"
    for name in ranks[0]:
        if name == "SLAMB":  # parameters agree only at sync steps
            continue
        a, b = ranks[0][name]["params"], ranks[1][name]["params"]
        assert torch.equal(a, b), f"op={name}: ranks 0 and 1 differ by {float((a - b).abs().max())}"
