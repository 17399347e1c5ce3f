"""Checks that the overlap tests of the bucketed algorithms (tests/test_onebit_overlap.py, test_birder_overlap.py,
test_slamb_overlap.py) make alike on what their workers saved through tests/workers/overlap_training.py."""

from __future__ import annotations


def check_buckets_started(where: str, ranks: list[dict], configs: list[str], buckets: int, steps: int) -> None:
    """Per configuration and rank: with overlap a bucket's collective started from a gradient hook before
    backward() returned, every step, and all had started when it returned; without overlap none before step()."""
    for name in configs:
        for r, rk in enumerate(ranks):
            on, off = rk["results"][(name, True)], rk["results"][(name, False)]
            assert on["overlap"] and not off["overlap"]
            assert on["buckets"] == off["buckets"] == buckets, f"{where} {name} rank {r}: {on['buckets']} buckets"
            assert all(d >= 1 for d in on["during"]), f"{where} {name} rank {r}: started during backward {on['during']}"
            assert on["after"] == [buckets] * steps, f"{where} {name} rank {r}: started by backward's end {on['after']}"
            assert off["during"] == off["after"] == [0] * steps, f"{where} {name} rank {r}: overlap=False started early"


def check_checkpoint_layouts(where: str, ranks: list[dict], algorithm: str, layout_free: bool = False) -> None:
    """``overlap_training.checkpoint_layouts``'s outcomes: another bucket layout refused naming bucket_mb, or with
    ``layout_free`` loaded as saved; reordered parameter sizes refused, with nothing changed; the pre-bucket schema
    loads where the layout is the same; overlap on and off load each other's."""
    refused_sizes = "the checkpoint's parameters" if layout_free else "the checkpoint's buckets"
    for r, rk in enumerate(ranks):
        got = rk["checkpoints"]
        for key in ("other_layout", "other_layout_back"):
            if layout_free:
                assert got[key] == "no error", f"{where} rank {r}: {key}: {got[key]}"
                assert got[f"{key}_equal"] == "True", f"{where} rank {r}: {key} loaded other state"
                continue
            assert got[key].startswith(f"ValueError: {algorithm}.load_state_dict: fused buffer sizes"), got[key]
            assert "bucket_mb" in got[key], f"{where} rank {r}: {got[key]}"
        assert got["other_sizes"].startswith(f"ValueError: {algorithm}.load_state_dict: {refused_sizes}"), \
            f"{where} rank {r}: {got['other_sizes']}"
        assert got["unchanged"] == "True", f"{where} rank {r}: a refused checkpoint changed the optimizer"
        assert got["old_schema"] == "no error", f"{where} rank {r}: {got['old_schema']}"
        assert got["old_schema_equal"] == "True", f"{where} rank {r}: the pre-bucket checkpoint loaded other state"
        assert got["on_into_off"] == "no error", f"{where} rank {r}: {got['on_into_off']}"
