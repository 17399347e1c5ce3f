"""Horovod's clipping pattern with every compressed op is never ignored (2 and 3 ranks, real processes): with
overlap, where the compressed stage had consumed the gradients in ``synchronize()``, ``step()`` honours an edit of
``.grad`` and ends bit-identical to the same run with ``overlap=False`` (which clips before any reduction); the
clip changes the result; one rank clipping alone is honoured on every rank alike. Adasum, whose local steps have
consumed the gradients, refuses the edit on every rank with a clear error."""

from __future__ import annotations

import pytest
from mpi_harness import horovodrun, load_ranks

HONOURED = ["OneBitAdam", "OneBitLamb", "Birder", "SLAMB"]


@pytest.mark.parametrize("n", [2, 3])
def test_clipping_after_synchronize_is_honoured_or_refused_on_every_rank(n: int, out_dir) -> None:
    horovodrun("clipping.py", n, out_dir, ",".join([*HONOURED, "Adasum"]), timeout=300)
    ranks = load_ranks(out_dir, n)
    for op in HONOURED:
        for mode in ("plain", "clip", "clip_nooverlap", "clip_one_rank"):
            got = {r[(op, mode)] for r in ranks}
            assert len(got) == 1, f"{op} {mode}: ranks differ at n={n}: {[r[(op, mode)] for r in ranks]}"
            assert len(next(iter(got))) == 64, f"{op} {mode} raised at n={n}: {got}"
        r0 = ranks[0]
        assert r0[(op, "clip")] == r0[(op, "clip_nooverlap")], f"{op}: the clip under overlap was not honoured"
        assert r0[(op, "clip")] != r0[(op, "plain")], f"{op}: clipping changed nothing (test too weak)"
        assert r0[(op, "clip_one_rank")] not in (r0[(op, "plain")], r0[(op, "clip")]), f"{op}: one rank's clip"
    for mode in ("clip", "clip_one_rank"):
        for r, rk in enumerate(ranks):
            assert rk[("Adasum", mode)].startswith("UsageError") and "synchronize() and step()" in \
                rk[("Adasum", mode)], f"Adasum {mode} rank {r}: {rk[('Adasum', mode)]}"
    assert len(ranks[0][("Adasum", "plain")]) == 64, ranks[0][("Adasum", "plain")]
