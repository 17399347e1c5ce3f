"""Checks that the overlap tests of the bucketed algorithms (tests/test_onebit_overlap.py, test_birder_overlap.py,
test_slamb_overlap.py) make alike on what their workers saved through tests/workers/overlap_training.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from mpi_harness import load_ranks, mpirun


def run_worker(tmp_path_factory, worker: str, n: int, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """One run of ``worker`` on ``n`` ranks (a module fixture's: each mpirun costs seconds); what each rank saved."""
    out = tmp_path_factory.mktemp(f"{worker.removesuffix('.py')}_{n}")
    mpirun(worker, n, out, *args, env={"HVDC_TIMEOUT": "60", **(env or {})}, timeout=300)
    return load_ranks(out, n)


def check_equal(what: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], item: str) -> None:
    """Each tensor of ``got`` equal to its counterpart in ``want``, element for element; a failure names the tensor
    and by how much it is off."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"{what}: {item} {i} off by {(a.double() - b.double()).abs().max().item():.3g}"


def check_on_equals_off(where: str, ranks: list[dict], configs: list[str], steps: int,
                        rank_alike: Callable[[int], bool] = lambda step: True,
                        stage: Callable[[int], str] = lambda step: "") -> None:
    """Per configuration and rank: the parameters after every step with overlap equal those without, and equal rank
    0's after each step ``rank_alike(step)`` (0-based) names; the final state tensors with overlap equal those
    without. ``stage(step)`` adds to a failure's message where in the run the step is."""
    for name in configs:
        for r, rk in enumerate(ranks):
            on, off = rk["results"][(name, True)], rk["results"][(name, False)]
            for step in range(steps):
                what = f"{where} {name} rank {r} step {step + 1}{stage(step)}"
                check_equal(f"{what}, overlap on vs off", on["params"][step], off["params"][step], "param")
                if rank_alike(step):
                    rank0 = ranks[0]["results"][(name, True)]["params"][step]
                    check_equal(f"{what}, vs rank 0", on["params"][step], rank0, "param")
            assert len(on["state"]) == len(off["state"]), f"{where} {name} rank {r}: state tensors differ in number"
            check_equal(f"{where} {name} rank {r}, overlap on vs off", on["state"], off["state"], "state tensor")


def check_nan_refused(where: str, ranks: list[dict], key: object, other_key: object, overlap: bool, buckets: int,
                      tensors: str) -> None:
    """``overlap_training.nan_step``'s outcome ``rk["nan"][key]`` on every rank: UsageError naming the non-finite
    value, every tensor (``tensors`` says which they are) unchanged, with overlap buckets started during backward;
    the recovery step equal on every rank and to the other mode's (``rk["nan"][other_key]``)."""
    for r, rk in enumerate(ranks):
        got = rk["nan"][key]
        assert got["buckets"] == buckets, f"{where} rank {r}: {got['buckets']} buckets"
        assert got["error"].startswith("UsageError:"), f"{where} overlap={overlap} rank {r}: {got['error']}"
        assert "non-finite" in got["error"] and "state unchanged" in got["error"], f"rank {r}: {got['error']}"
        if overlap:  # the earlier buckets' collectives ran (and were undone)
            assert got["launched"][-1] >= 1, f"{where} rank {r}: nothing started during backward"
        assert got["changed"] == [], (
            f"{where} overlap={overlap} rank {r}: tensors {got['changed']} of {got['tensors']} ({tensors}) changed "
            "in the refused step"
        )
        check_equal(f"{where}: after the error, rank {r} vs rank 0", got["after_recovery"],
                    ranks[0]["nan"][key]["after_recovery"], "param")
        # The refused step left no trace: the runs with and without overlap continue alike.
        check_equal(f"{where} rank {r}: recovery, overlap {overlap} vs {not overlap}", got["after_recovery"],
                    rk["nan"][other_key]["after_recovery"], "param")

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
