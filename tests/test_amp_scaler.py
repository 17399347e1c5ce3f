"""``torch.amp.GradScaler`` with the bucketed ops (1-bit Adam/LAMB, Birder, SLAMB), op=Average (also with top-k
compression) and op=PowerSGD, 2 and 3 ranks, real processes. With overlap the compressed stage consumes the
gradients in the hooks while they are still scaled; ``scaler.step`` hands the scaler to ``step()``, which unscales,
agrees with every rank on inf/NaN, and reduces the unscaled gradients anew. op=Average and op=PowerSGD reduce in
place: ``step()`` unscales first where nothing was reduced during backward (overlap off, top-k, whose error feedback
then never sees a skipped step's inf: its check would refuse it on every rank), else once every bucket has landed (a
scaler that unscaled them itself would read buckets still being reduced, and with an inf on one rank that rank would
skip ``step()`` while the others wait in it). A power-of-two scale unscales exactly, so a run with the scaler must
equal the run without it bit for bit, also where the scale doubles after every step (PowerSGD brings its error,
reduced at the last step's scale, to the new one); an inf on one rank skips the step on every rank and halves every
rank's scale once: PowerSGD keeps its error, P and Q from before the inf, where torch's hook would carry NaN into
every later step; Horovod's AMP clipping pattern gives the same result with overlap on and off."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

OPS = ["OneBitAdam", "OneBitLamb", "Birder", "SLAMB", "Average", "PowerSGD", "PowerSGD0", "TopK", "ZeroOneAdam"]
#: Ops whose ranks hold different parameters between syncs by design: SLAMB between its parameter averages; 0/1
#: Adam after a local step (the skipped step moves its schedule: the last step of ``inf_one_rank`` is a local one).
DIFFER = {"SLAMB": ("plain", "inf_one_rank", "clip", "recipe"), "ZeroOneAdam": ("inf_one_rank",)}
#: Ops that reduce into ``.grad`` in place during backward (overlap): ``backward()`` waits for them, as DDP's does.
IN_PLACE = ("Average", "PowerSGD")


@pytest.mark.parametrize("n", [2, 3])
def test_grad_scaler_unscales_before_the_compressed_reduction_and_skips_on_every_rank(n: int, out_dir) -> None:
    mpirun("amp_scaler.py", n, out_dir, ",".join(OPS), timeout=300)
    ranks = load_ranks(out_dir, n)
    for op in OPS:
        for r, rk in enumerate(ranks):
            res = {mode: rk[(op, mode)] for mode in ("plain", "scaler", "scaler_growing", "scaler_nooverlap",
                                                      "inf_one_rank", "clip", "clip_nooverlap", "recipe")}
            bad = {m: v for m, v in res.items() if not isinstance(v, tuple)}
            assert not bad, f"{op} rank {r} of {n} raised: {bad}"
            assert res["scaler"][0] == res["plain"][0], f"{op} rank {r}: the scaled run differs from the plain one"
            assert res["scaler_nooverlap"][0] == res["plain"][0], f"{op} rank {r}: overlap=False with the scaler"
            # The scale doubles after every step (PowerSGD's error carries it over from one step to the next).
            assert res["scaler_growing"][0] == res["plain"][0], f"{op} rank {r}: a growing scale changed the run"
            assert res["scaler_growing"][1] == 2.0**17, f"{op} rank {r}: scale {res['scaler_growing'][1]}"
            assert res["clip"][0] == res["clip_nooverlap"][0], f"{op} rank {r}: AMP clipping under overlap ignored"
            assert res["inf_one_rank"][1] == 512.0, f"{op} rank {r}: scale {res['inf_one_rank'][1]} (one skip: 512)"
            if op in IN_PLACE:  # backward() returned the reduced gradients: the recipe clips them, as Horovod's
                assert res["recipe"] == res["clip"], f"{op} rank {r}: torch's AMP recipe differs from Horovod's"
                # A parameter without a gradient held back the later buckets: clipping before synchronize() would
                # have seen averaged and local gradients alike (the ranks stepped apart); it raises on every rank.
                got = rk[(op, "held_back_recipe")]
                assert got.startswith("UsageError") and "opt.synchronize() before" in got, f"{op} rank {r}: {got}"
        if op in IN_PLACE:
            assert len({rk[(op, "held_back_pattern")] for rk in ranks}) == 1, f"{op}: Horovod's pattern, ranks differ"
            # Reentrant checkpointing ends a nested backward before the outer one has started every bucket: once
            # the outer one has, nothing is held back and the recipe equals Horovod's pattern on every rank.
            got = {(rk[(op, "checkpointed_recipe")], rk[(op, "checkpointed_pattern")]) for rk in ranks}
            assert len(got) == 1 and len(next(iter(got))[0]) == 64, f"{op} under checkpointing: {got}"
            assert next(iter(got))[0] == next(iter(got))[1], f"{op} under checkpointing: recipe and pattern differ"
            # Backward started every bucket on rank 0 and none on the others: the scaler's agreement still comes at
            # the same place in every rank's collectives.
            got = {rk[(op, "first_on_rank_zero")] for rk in ranks}
            assert len(got) == 1 and not next(iter(got)).startswith(("Usage", "Mismatch", "Rejected")), f"{op}: {got}"
        for mode in ("plain", "inf_one_rank", "clip", "recipe"):
            if mode not in DIFFER.get(op, ()):
                assert len({rk[(op, mode)] for rk in ranks}) == 1, f"{op} {mode}: ranks differ at n={n}"
