"""``zero_grad()`` under ``hc.DistributedOptimizer``, as docs/migrating-from-horovod.md states it: with op=Adasum the
wrapped optimizer's own ``zero_grad`` runs, so ``zero_grad()`` sets ``.grad`` to None as Horovod's wrapper does
(whose ``zero_grad`` takes no ``set_to_none``);
with every other op the gradients are views into fused buffers, so any call form zeroes them in place and the next
step still trains. Real processes at 2 ranks, with Horovod's wrapper beside hc's."""

from __future__ import annotations

from mpi_harness import load_ranks, mpirun


def test_zero_grad_sets_none_as_horovod_with_adasum_and_zeroes_in_place_with_the_other_ops(out_dir) -> None:
    mpirun("zero_grad.py", 2, out_dir, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        got = rk["grads"]
        for form in ("default", "set_to_none=True", "set_to_none=False"):
            assert got[f"horovod {form}"] == ("None" if form == "default" else "TypeError"), f"rank {r}: {got}"
            want = "zero" if form == "set_to_none=False" else "None"
            assert got[f"Adasum {form}"] == want, f"rank {r} of 2, Adasum, zero_grad({form}): {got}"
            for op in ("Average", "Sum", "OneBitAdam", "OneBitLamb", "SLAMB", "Birder"):
                assert got[f"{op} {form}"] == "zero", f"rank {r} of 2, {op}, zero_grad({form}): {got[f'{op} {form}']}"
