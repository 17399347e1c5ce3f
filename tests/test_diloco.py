"""hc.DistributedOptimizer(op=hc.DiLoCo) (DiLoCo, arXiv 2311.08105; Streaming DiLoCo, arXiv 2501.18512) against the
NumPy reference (hvd_compress/reference/diloco.py), one process per rank at 2, 3 and 4 ranks (4: the long tier), one
launch per rank count: every rank's parameters after every step of every config of tests/workers/diloco_task.py (plain
DiLoCo, momentum without Nesterov, fragments with a sync delay and a mix, every outer_compression with error feedback;
the core's int8/int4 collective alone); bytes only on sync steps, falling with the fragments and the wire format; a run
resumed from a mid-phase state_dict() (a sync in flight, error feedback) continues bit for bit; a 2-rank checkpoint
continues at 3 ranks as the reference does; bad options raise on every rank; hvd.DistributedOptimizer and the op's name
run the same op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import Cases
from workers.diloco_task import CONFIGS, OUTER, OUTER_RESUME, REGROW, RESUMES, SHAPES, SIZES, STEPS, initial, inner_step

from hvd_compress.reference.block_quant import block_quant_allreduce
from hvd_compress.reference.diloco import ReferenceDiLoCo

WORLDS = (2, 3, pytest.param(4, marks=pytest.mark.long))


class RegrowCases(Cases):
    """The 3-rank launch loads the checkpoint the 2-rank launch writes: that one runs first, whichever test asks."""

    def ranks(self, n: int, case: tuple) -> list[dict]:
        if n == 3:
            super().ranks(2, ("regrow-save",))
        return super().ranks(n, case)


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    base = tmp_path_factory.mktemp("diloco")
    regrow = str(base / "diloco_n2" / "case1" / "regrow.pt")  # the 2-rank launch's second case writes it
    cases = {2: [("main",), ("regrow-save",), (("fast",), {}, "diloco_bn.py")],
             3: [("main",), ("regrow-load", regrow)], 4: [("main",), (("long",), {}, "diloco_bn.py")]}
    return RegrowCases("diloco.py", cases, base, timeout_per_case=120)


def reference_run(world: int, options: dict) -> list[list[np.ndarray]]:
    """Each step's parameters of every virtual rank."""
    ref = ReferenceDiLoCo([initial()] * world, SIZES, **options)
    return [ref.run(inner_step) for _ in range(STEPS)]


class TorchOuter:
    """One process's torch optimizer stepping the reference's synced fragments (ReferenceDiLoCo's ``outer``), over
    tensors shaped as the parameters, fragment after fragment (the order the face gives them to the factory)."""

    def __init__(self, cls: str, kwargs: dict, fragments: int) -> None:
        self.params = [[torch.zeros(SHAPES[i]) for i in range(f, len(SHAPES), fragments)] for f in range(fragments)]
        self.opt = getattr(torch.optim, cls)([p for m in self.params for p in m], **kwargs)

    def __call__(self, f: int, synced: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        offset = 0
        for p in self.params[f]:
            n = p.numel()
            p.copy_(torch.from_numpy(synced[offset : offset + n]).view_as(p))
            p.grad = torch.from_numpy(gradient[offset : offset + n].copy()).view_as(p)
            offset += n
        self.opt.step()
        for p in self.params[f]:
            p.grad = None
        return torch.cat([p.reshape(-1) for p in self.params[f]]).numpy().copy()


def outer_reference(world: int, name: str) -> tuple[ReferenceDiLoCo, TorchOuter]:
    options, cls, kwargs = OUTER[name]
    outer = TorchOuter(cls, kwargs, options.get("fragments", 1))
    return ReferenceDiLoCo([initial()] * world, SIZES, **options, outer=outer), outer


def check_close(got: np.ndarray, want: np.ndarray, exact: bool, where: str) -> None:
    """Bit for bit where every sum is in a fixed order (2 ranks, the 16-bit wire's rank-order float32 sums); else
    (MPI's float32 sum of 3 or 4 ranks, the reference's exact one) to 1e-6 of the largest magnitude."""
    diff = float(np.abs(got - want).max())
    if exact:
        assert np.array_equal(got, want), f"{where}: differs from the reference by {diff:.3g}"
    else:
        assert diff <= 1e-6 * max(1.0, float(np.abs(want).max())), f"{where}: differs from the reference by {diff:.3g}"


@pytest.mark.parametrize("world", WORLDS)
def test_diloco_matches_reference_at_every_step(launched, world) -> None:
    ranks = launched.ranks(world, ("main",))
    for name, options in CONFIGS.items():
        want = reference_run(world, options)
        exact = world == 2 or options.get("outer_compression", "none") != "none"
        for r, got in enumerate(ranks):
            for t in range(STEPS):
                check_close(got["runs"][name]["flats"][t], want[t][r], exact,
                            f"config {name} {options}, {world} ranks, rank {r}, after step {t}")
        # Not vacuous: the ranks' local steps differ, and syncs bring the synced fragments together.
        first = ranks[0]["runs"][name]["flats"]
        assert any(not np.array_equal(first[t], ranks[1]["runs"][name]["flats"][t]) for t in range(STEPS)), name


@pytest.mark.parametrize("world", WORLDS)
def test_diloco_outer_optimizer_of_the_users_matches_torch_on_the_reference(launched, world) -> None:
    """outer_optimizer=: the parameters after every step equal the NumPy reference's whose outer step is one
    process's torch optimizer on the reference's averaged outer gradients (Nesterov SGD; Adam on 2 fragments with a
    sync delay); torch's Nesterov SGD is DiLoCo's built-in rule up to the rounding of torch's fused multiply-add."""
    ranks = launched.ranks(world, ("main",))
    for name in OUTER:
        ref, _ = outer_reference(world, name)
        want = [ref.run(inner_step) for _ in range(STEPS)]
        for r, got in enumerate(ranks):
            for t in range(STEPS):
                check_close(got["runs"][name]["flats"][t], want[t][r], world == 2,
                            f"outer optimizer {name}, {world} ranks, rank {r}, after step {t}")
    builtin = reference_run(world, CONFIGS["plain"])
    assert OUTER["outer_sgd"][0] == CONFIGS["plain"]
    for r, got in enumerate(ranks):
        for t in range(STEPS):
            a, b = got["runs"]["outer_sgd"]["flats"][t], builtin[t][r]
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), \
                f"{world} ranks, rank {r}, step {t}: torch's Nesterov SGD differs from the built-in rule by " \
                f"{np.abs(a - b).max():.3g}"
        # Not vacuous: Adam's outer step is not the built-in one.
        assert not np.allclose(got["runs"]["outer_adam"]["flats"][-1], got["runs"]["stream3"]["flats"][-1])


@pytest.mark.parametrize("world", WORLDS)
def test_diloco_sends_only_at_syncs_and_less_per_step_with_fragments(launched, world) -> None:
    """Plain DiLoCo sends on its sync steps only; 2 fragments halve the peak bytes of a step (give or take the
    calls' fixed bytes); fp16 halves a fragment's bytes again."""
    for r, got in enumerate(launched.ranks(world, ("main",))):
        sent = got["runs"]["plain"]["sent"]
        h = CONFIGS["plain"]["sync_every"]
        for t, b in enumerate(sent):
            assert (b > 0) == ((t + 1) % h == 0), f"{world} ranks, rank {r}: plain DiLoCo sent {sent}"
        full, halves = max(sent), max(got["runs"]["stream"]["sent"])
        assert 0 < halves <= 0.55 * full, \
            f"{world} ranks, rank {r}: peak bytes {halves} with 2 fragments, {full} with 1"
        fp16 = max(got["runs"]["fp16"]["sent"])
        assert 0 < fp16 <= 0.55 * halves, f"{world} ranks, rank {r}: peak bytes {fp16} fp16, {halves} float32"
        int8, int4 = max(got["runs"]["int8"]["sent"]), max(got["runs"]["int4"]["sent"])
        assert 0 < int8 <= 0.3 * full, f"{world} ranks, rank {r}: peak bytes {int8} int8, {full} float32"
        assert 0 < int4 <= 0.2 * halves, f"{world} ranks, rank {r}: peak bytes {int4} int4, {halves} float32"


@pytest.mark.parametrize("world", WORLDS)
def test_diloco_resumes_bit_for_bit_mid_phase(launched, world) -> None:
    for r, got in enumerate(launched.ranks(world, ("main",))):
        for name, at in [*RESUMES, OUTER_RESUME]:
            want, resumed = got["resumed"][f"{name}@{at}"]
            assert len(want) == len(resumed) == STEPS - at
            for t, (a, b) in enumerate(zip(want, resumed, strict=True)):
                assert np.array_equal(a, b), \
                    f"{name} resumed after step {at}, {world} ranks, rank {r}, step {at + t}: differs by " \
                    f"{float(np.abs(a - b).max()):.3g}"


def test_diloco_checkpoint_of_2_ranks_continues_at_3(launched) -> None:
    """Rank 0's state_dict() of a 2-rank run (a sync in flight) loaded on every rank of a 3-rank run: DiLoCo's state
    is the same on every rank, so the 3 ranks continue from rank 0's parameters as the reference does."""
    assert launched.ranks(2, ("regrow-save",))[0]["done"]
    saved = torch.load(launched.base / "diloco_n2" / "case1" / "regrow.pt", weights_only=True)
    name, at = REGROW
    section = saved["opt"]["hvd_compress"]["diloco"]
    state = {"step": section["step"], "synced": [x.numpy() for x in section["synced"]],
             "momentum": [x.numpy() for x in section["momentum"]],
             "averaged": {f: (s, a.numpy()) for f, (s, a) in section["averaged"].items()}}
    assert state["step"] == at and state["averaged"], "the checkpoint should hold a sync in flight"
    ref = ReferenceDiLoCo([initial()] * 3, SIZES, **CONFIGS[name])
    ref.load(state, [np.array(saved["params"], dtype=np.float32)] * 3)
    want = [ref.run(inner_step) for _ in range(at, STEPS)]
    for r, got in enumerate(launched.ranks(3, ("regrow-load", str(launched.base / "diloco_n2" / "case1" /
                                                                   "regrow.pt")))):
        for t, flat in enumerate(got["flats"]):
            check_close(flat, want[t][r], False, f"resumed at 3 ranks, rank {r}, step {at + t}")
    # The outer optimizer's state (torch Adam's) travels in DiLoCo's section and continues at 3 ranks.
    saved = torch.load(launched.base / "diloco_n2" / "case1" / "regrow_outer.pt", weights_only=True)
    name, at = OUTER_RESUME
    section = saved["opt"]["hvd_compress"]["diloco"]
    assert section["momentum"] is None and section["outer"]["state"], "the checkpoint should hold Adam's state"
    ref, outer = outer_reference(3, name)
    outer.opt.load_state_dict(section["outer"])
    ref.load({"step": section["step"], "synced": [x.numpy() for x in section["synced"]], "momentum": None,
              "averaged": {f: (s, a.numpy()) for f, (s, a) in section["averaged"].items()}},
             [np.array(saved["params"], dtype=np.float32)] * 3)
    want = [ref.run(inner_step) for _ in range(at, STEPS)]
    for r, got in enumerate(launched.ranks(3, ("regrow-load", str(launched.base / "diloco_n2" / "case1" /
                                                                   "regrow.pt")))):
        for t, flat in enumerate(got["outer_flats"]):
            check_close(flat, want[t][r], False, f"outer Adam resumed at 3 ranks, rank {r}, step {at + t}")


@pytest.mark.parametrize("world", WORLDS)
def test_block_quantized_allreduce_matches_reference(launched, world) -> None:
    """The core's int8/int4 collective (Average and Sum, sizes that pad a chunk) against reference/block_quant.py, bit
    for bit: the result on every rank and each rank's new error; a NaN on one rank and bits that differ by rank raise
    on every rank, the error unchanged."""
    ranks = launched.ranks(world, ("main",))
    for key in ranks[0]["quantized"]["calls"]:
        bits, op, numel = key
        xs = [got["quantized"]["calls"][key][0] for got in ranks]
        es = [got["quantized"]["calls"][key][1] for got in ranks]
        want, errors = block_quant_allreduce(xs, es, bits, op)
        for r, got in enumerate(ranks):
            _, _, result, error = got["quantized"]["calls"][key]
            where = f"int{bits} {op} of {numel}, {world} ranks, rank {r}"
            assert np.array_equal(result, want), f"{where}: result differs by {np.abs(result - want).max():.3g}"
            assert np.array_equal(error, errors[r]), f"{where}: error differs by {np.abs(error - errors[r]).max():.3g}"
        # Not vacuous: quantization lost something, and the result is close to the exact average.
        exact = np.mean([x + e for x, e in zip(xs, es, strict=True)], axis=0) * (world if op == "Sum" else 1)
        assert np.abs(errors[0]).max() > 0
        assert np.abs(want - exact).max() <= (0.2 if bits == 4 else 0.02) * np.abs(exact).max() * world
    for r, got in enumerate(ranks):
        refusals = got["quantized"]["refusals"]
        assert refusals["nan"].startswith("RejectedInputError") and "non-finite" in refusals["nan"], \
            f"rank {r}: {refusals['nan']}"
        assert refusals["nan_error_kept"], f"rank {r}: a refused call changed the error"
        assert refusals["bits"].startswith("MismatchError"), f"rank {r}: {refusals['bits']}"


BAD = {
    "sync_every0": ("ValueError", "sync_every"), "sync_every_float": ("ValueError", "sync_every"),
    "outer_lr0": ("ValueError", "outer_lr"), "outer_lr_nan": ("ValueError", "outer_lr"),
    "momentum1": ("ValueError", "outer_momentum"), "nesterov_str": ("ValueError", "nesterov"),
    "fragments_over_h": ("ValueError", "fragments"), "fragments_over_params": ("ValueError", "fragments=6"),
    "delay_h": ("ValueError", "sync_delay"), "mix1": ("ValueError", "mix"),
    "compression": ("ValueError", "outer_compression"), "unknown": ("TypeError", "outer_beta"),
    "bucket": ("TypeError", "bucket_mb"), "predivide": ("ValueError", "gradient_predivide_factor"),
    "load_other_options": ("ValueError", "DiLoCo options"),
    "nan_none": ("RejectedInputError", "not finite"), "nan_int8": ("RejectedInputError", "non-finite"),
    "schedules_differ": ("MismatchError", "sync_every: rank 0=2"),
    "outer_instance": ("TypeError", "outer_optimizer must be a function"),
    "outer_returns_other": ("TypeError", "must return a torch.optim.Optimizer"),
    "outer_other_params": ("ValueError", "exactly the params"), "outer_and_outer_lr": ("ValueError", "outer_lr"),
    "load_other_outer": ("ValueError", "outer optimizer"), "buffers_not_tensors": ("TypeError", "buffers must be"),
}


@pytest.mark.parametrize("world", WORLDS)
def test_diloco_bad_options_raise_on_every_rank(launched, world) -> None:
    for r, got in enumerate(launched.ranks(world, ("main",))):
        assert set(got["bad"]) == set(BAD)
        for case, (kind, words) in BAD.items():
            text = got["bad"][case]
            assert text.startswith(kind + ":") and words in text, f"{world} ranks, rank {r}, {case}: {text}"


def test_diloco_through_horovod_and_by_name(launched) -> None:
    for r, got in enumerate(launched.ranks(2, ("main",))):
        through_hvd, by_name, wrapped = got["horovod"]
        assert wrapped, f"rank {r}: hvd.DistributedOptimizer(op=hc.DiLoCo) did not return hc's wrapper"
        for t, (a, b) in enumerate(zip(through_hvd, by_name, strict=True)):
            assert np.array_equal(a, b), f"rank {r}, step {t}: hvd's and op='diloco' differ"


#: The held-out accuracy the 2-rank BatchNorm run must reach (60 inner steps, 6 syncs; it reaches about 0.95).
BN_ACCURACY_FLOOR = 0.9


def test_diloco_averages_batchnorm_buffers_so_ranks_evaluate_the_same_model(launched) -> None:
    """buffers=model.buffers(): after a run that ends on a sync, every rank's eval-mode logits on the held-out digits
    are the same bits (the running statistics averaged at the merge); without it they differ (each rank's own
    statistics); the synced model has learned."""
    ranks = launched.ranks(2, (("fast",), {}, "diloco_bn.py"))
    for r, got in enumerate(ranks[1:], start=1):
        a, b = ranks[0]["synced"]["logits"], got["synced"]["logits"]
        assert np.array_equal(a, b), f"rank {r}'s eval-mode logits differ from rank 0's by {np.abs(a - b).max():.3g}"
        assert not np.array_equal(ranks[0]["unsynced"]["logits"], got["unsynced"]["logits"]), \
            "without buffers= the ranks' running statistics should differ"
    accuracy = ranks[0]["synced"]["accuracy"]
    assert accuracy >= BN_ACCURACY_FLOOR, f"held-out accuracy {accuracy:.3f} < {BN_ACCURACY_FLOOR}"


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (Student's t, n - 1 degrees of freedom; n = 6: t = 2.571)."""
    t = {5: 2.571}[len(xs) - 1]
    return float(np.mean(xs)), t * float(np.std(xs, ddof=1)) / len(xs) ** 0.5


@pytest.mark.long
def test_diloco_batchnorm_held_out_loss_against_dense_adam(launched) -> None:
    """6 model seeds at 4 ranks, 300 inner steps each: DiLoCo's (H = 20, buffers averaged) eval-mode held-out loss
    against dense Adam's (op=hc.Average, rank 0's statistics); the means with their 95% intervals are printed.
    Asserted: DiLoCo's mean is within twice the upper end of dense's interval."""
    losses = launched.ranks(4, (("long",), {}, "diloco_bn.py"))[0]["losses"]
    (d, dh), (a, ah) = interval(losses["diloco"]), interval(losses["dense"])
    print(f"\nheld-out loss after 300 inner steps, 4 ranks, 6 seeds: DiLoCo {d:.4f} +- {dh:.4f}, "
          f"dense Adam {a:.4f} +- {ah:.4f}")
    assert d <= 2 * (a + ah), f"DiLoCo {d:.4f} +- {dh:.4f}, dense Adam {a:.4f} +- {ah:.4f}"
