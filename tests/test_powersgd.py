"""hc.DistributedOptimizer(op=hc.PowerSGD) (Vogels et al. 2019, Alg. 1 and 2) against torch's own powerSGD_hook on
the same gradients, one process per rank (gloo beside MPI), at matrix_approximation_rank 1 and 2 on 2 ranks, 3 on 3
ranks and 4 on 4 ranks (``RUNS``): the same reduced gradients, P, Q and error feedback over steps crossing
start_powerSGD_iter with warm start, in one bucket and in several; the same against the NumPy reference, in one
bucket and in several; a run resumed from state_dict() continues bit for bit; overlap on and off agree to the bit;
bad options raise on every rank. One process: the bits do not depend on where a bucket starts in memory."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from mpi_harness import Cases

from hvd_compress.algorithms.powersgd import PowerSGDOptions, PowerSGDState, reduce_bucket
from hvd_compress.reference.powersgd import Buckets
from hvd_compress.torch.powersgd import TorchMatrices

START, STEPS, RESUME_AT, INF_AT, UNFROZEN_AT = 2, 6, 4, (1, 3), 4  # as tests/workers/powersgd.py
COMPRESSED_SHAPE_INDEX, RANK_R_SHAPE = 5, (40, 60)  # a parameter that is compressed at every rank tested


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def close(got: torch.Tensor, want: torch.Tensor, exact: bool) -> tuple[bool, float]:
    """Whether ``got`` matches ``want`` (bit for bit, or to 1e-5 of ``want``'s largest magnitude), and by how much
    they differ."""
    diff = float((got - want).abs().max()) if got.numel() else 0.0
    if exact or not want.numel():
        return torch.equal(got, want), diff
    return diff <= 1e-5 * max(1.0, float(want.abs().max())), diff


#: (world, r) of each run: r = 1 (torch's default) and 2 orthogonalize by Gram-Schmidt, r = 3 and 4 (the bench's)
#: by QR, as torch's hook does.
RUNS = [(2, 1), (2, 2), (3, 3), (4, 4)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    """One launch of the worker per rank count, running its cases in turn, each with its own gloo port."""
    cases: dict[int, list[tuple[str, str]]] = {}
    for world, rank_r in RUNS:
        cases.setdefault(world, []).append((free_port(), str(rank_r)))
    return Cases("powersgd.py", cases, tmp_path_factory.mktemp("powersgd"), timeout_per_case=150)


@pytest.fixture(scope="module", params=range(len(RUNS)), ids=[f"n{world}-r{rank_r}" for world, rank_r in RUNS])
def run(request, launched) -> tuple[int, int, list[dict]]:
    """(world, r, what each rank saved) of the worker's run at ``world`` ranks and rank ``r``."""
    world, rank_r = RUNS[request.param]
    case = launched.cases[world][[r for w, r in RUNS if w == world].index(rank_r)]
    return world, rank_r, launched.ranks(world, case)


# At 2 ranks every sum over ranks is one (commutative) addition and the average's division by 2 is exact, so ours
# and torch's hook, which run the same torch matrix calls, must agree to the bit. At 3 and 4 ranks the core and gloo
# add the terms in different orders and divide differently (one float32 rounding each), and that difference
# passes through the orthogonalization and the error feedback of every later step: 1e-5 of the largest magnitude
# (about 80 float32 ulps) bounds it over these 4 compressed steps.
def check_against_hook(world: int, rank_r: int, ranks: list[dict], ours_key: str, theirs_key: str) -> None:
    exact = world == 2
    for r, got in enumerate(ranks):
        buckets = len(got["spans" if ours_key == "ours" else "small_spans"])
        for t, (ours, theirs) in enumerate(zip(got[ours_key], got[theirs_key], strict=True)):
            where = f"world {world}, {buckets} bucket(s), rank {r}, step {t}"
            for i, (a, b) in enumerate(zip(ours["grads"], theirs["grads"], strict=True)):
                ok, diff = close(a, b, exact)
                assert ok, f"{where}: reduced gradient {i} differs from torch's hook by {diff:.3g}"
            for key in ("error", "p", "q"):
                want = set(range(buckets)) if t >= START else set()
                assert set(ours[key]) == set(theirs[key]) == want, \
                    f"{where}: {key} of buckets {sorted(ours[key])}, torch's hook {sorted(theirs[key])}"
                for b in want:
                    ok, diff = close(ours[key][b], theirs[key][b], exact)
                    assert ok, f"{where}: {key} of bucket {b} differs from torch's hook by {diff:.3g}"
            if t >= START:  # compressed: the reduced matrix is of rank r at most
                m = ours["grads"][COMPRESSED_SHAPE_INDEX]
                assert m.shape == RANK_R_SHAPE and torch.linalg.matrix_rank(m) <= rank_r, where
            for i, (a, b) in enumerate(zip(ours["params"], ranks[0][ours_key][t]["params"], strict=True)):
                assert torch.equal(a, b), f"{where}: parameter {i} differs from rank 0's"


def test_powersgd_matches_torch_hook(run) -> None:
    world, rank_r, ranks = run
    assert len(ranks[0]["spans"]) == 1
    check_against_hook(world, rank_r, ranks, "ours", "theirs")


def test_powersgd_sends_p_q_and_the_small_tensors_only(run) -> None:
    """From start_powerSGD_iter on a step sends (rows + cols) r numbers per compressed matrix and the small tensors
    dense: 1010 of 6746 numbers here at r = 1, 1946 at r = 4 (three calls instead of one, each with the core's fixed
    bytes)."""
    world, _, ranks = run
    for r, got in enumerate(ranks):
        sent = [step["bytes"]["bytes_sent"] for step in got["ours"]]
        assert sent[0] > 0 and sent[0] == sent[START - 1], f"world {world}, rank {r}: dense steps sent {sent}"
        for t in range(START, STEPS):
            assert 0 < sent[t] <= 0.5 * sent[0], f"world {world}, rank {r}, step {t}: sent {sent[t]} of {sent[0]}"


def test_powersgd_matches_torch_hook_over_several_buckets(run) -> None:
    """Buckets of 2 KiB: each bucket keeps its own error, P and Q, and draws its first Q in bucket order, as torch's
    hook does over DDP's buckets."""
    world, rank_r, ranks = run
    assert len(ranks[0]["small_spans"]) >= 3, ranks[0]["small_spans"]
    check_against_hook(world, rank_r, ranks, "small", "small_theirs")


def test_powersgd_resumes_bit_for_bit_and_overlap_changes_nothing(run) -> None:
    """A run resumed from a state_dict() (saved, loaded with weights_only=True) continues as the uninterrupted one;
    a model trained by backward passes (1 and 2 per step) gets the same bits with overlap on and off."""
    world, _, ranks = run
    for r, got in enumerate(ranks):
        for t, (a, b) in enumerate(zip(got["resumed"], got["ours"][RESUME_AT:], strict=True)):
            where = f"world {world}, rank {r}, resumed at step {RESUME_AT}, step {RESUME_AT + t}"
            for key in ("grads", "params"):
                for i, (x, y) in enumerate(zip(a[key], b[key], strict=True)):
                    assert torch.equal(x, y), f"{where}: {key}[{i}] differs by {float((x - y).abs().max()):.3g}"
            for key in ("error", "p", "q"):
                assert torch.equal(a[key][0], b[key][0]), f"{where}: {key} differs"
        for (overlap, passes), steps in got["trained"].items():
            where = f"world {world}, rank {r}, overlap {overlap}, passes {passes}"
            other = got["trained"][(not overlap, passes)]
            for t, (a, b) in enumerate(zip(steps, other, strict=True)):
                assert torch.equal(a, b), f"{where}, step {t}: overlap on and off differ"
                assert torch.equal(a, ranks[0]["trained"][(overlap, passes)][t]), \
                    f"{where}, step {t}: parameters differ from rank 0's"


def torch_draw(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    """torch's hook's first Q: one CPU generator seeded with ``seed``, one float32 randn per Q in order."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, *s, generator=gen)[0].double().numpy() for s in shapes]


#: Our run compared with the reference: (its inputs, its buckets) in what the worker saved.
RUNS_VS_REFERENCE = {"ours": ("inputs", "spans"), "small": ("inputs", "small_spans"),
                     "inf": ("inf_inputs", "small_spans"), "frozen": ("frozen_inputs", "small_spans")}


@pytest.mark.parametrize("ours_key", list(RUNS_VS_REFERENCE),
                         ids=["one-bucket", "2KiB-buckets", "inf-on-one-rank", "zero-then-not"])
def test_powersgd_matches_numpy_reference(run, ours_key) -> None:
    """Ours (float32) against hvd_compress.reference.powersgd (float64, n virtual ranks) on the same gradients, in one
    bucket, in 2 KiB buckets (each its own error, P and Q, the first Q drawn in bucket order), and in 2 KiB
    buckets with an inf in one rank's gradient at one step (that bucket's result is not finite, its state stays
    as it was, the others go on), and in 2 KiB buckets with one matrix's gradient zero on every rank for the
    first compressed steps (a layer unfrozen later: torch's hook gives it NaN at r <= 2 with
    orthogonalization_epsilon 0; ours a zero result, then its gradient once it has one): the reduced gradients,
    every rank's error, P and Q of every bucket, to 2e-5 of their largest magnitude (float32 rounding of the
    products and orthogonalizations, carried by the error feedback over 4 compressed steps; measured: below
    2e-6), and inf/NaN where the reference has them."""
    world, rank_r, ranks = run
    inputs_key, spans_key = RUNS_VS_REFERENCE[ours_key]
    shapes = [tuple(g.shape) for g in ranks[0]["inputs"][0]]
    spans = ranks[0][spans_key]
    assert len(spans) == 1 if ours_key == "ours" else len(spans) >= 3, spans
    ref = Buckets(world, shapes, spans, rank_r, START, random_seed=7, draw=torch_draw)

    def near(got: torch.Tensor, want: np.ndarray, what: str) -> None:
        got = got.double().numpy().reshape(want.shape)
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), f"world {world}: {what} not finite where the reference is"
        if not finite.any():
            return
        diff = float(np.abs(got[finite] - want[finite]).max())
        assert diff <= 2e-5 * max(1.0, float(np.abs(want[finite]).max())), f"world {world}: {what} off by {diff:.3g}"

    def flat(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0)

    rejected = 0
    for t in range(STEPS):
        reduced = ref.step([[g.double().numpy() for g in got[inputs_key][t]] for got in ranks])
        rejected += not all(np.isfinite(g).all() for g in reduced)
        for r, got in enumerate(ranks):
            ours = got[ours_key][t]
            for i, want in enumerate(reduced):
                near(ours["grads"][i], want, f"rank {r}, step {t}, gradient {i}")
            if t < START:
                continue
            for b, bucket in enumerate(ref.buckets):
                where = f"rank {r}, step {t}, bucket {b} of {len(spans)}"
                near(ours["error"][b], flat(bucket.errors[r]), f"{where}, error")
                near(ours["p"][b], flat(bucket.ps), f"{where}, P")
                near(ours["q"][b], flat(bucket.qs), f"{where}, Q")
    assert rejected == (ours_key == "inf"), f"{rejected} step(s) with a result not finite"
    if ours_key == "frozen":  # zero while frozen, then not
        for r, got in enumerate(ranks):
            for t in range(STEPS):
                g = got["frozen"][t]["grads"][0]
                assert bool((g == 0).all()) == (t < UNFROZEN_AT), f"world {world}, rank {r}, step {t}: {g.abs().max()}"
    if ours_key == "inf":  # the state after the step with the inf is the state before it, to the bit
        _, step = INF_AT
        bucket = next(b for b, span in enumerate(spans) if 0 in span)
        for r, got in enumerate(ranks):
            for key in ("error", "p", "q"):
                before, after = got["inf"][step - 1][key][bucket], got["inf"][step][key][bucket]
                assert torch.equal(before, after), f"world {world}, rank {r}: {key} of bucket {bucket} changed"


def test_hvd_distributed_optimizer_runs_hc_powersgd(run) -> None:
    """After hvd.init(), Horovod's hvd.DistributedOptimizer(op=hc.PowerSGD) returns hc's wrapper and trains as
    hc.DistributedOptimizer does, bit for bit, every rank alike."""
    world, _, ranks = run
    for r, got in enumerate(ranks):
        via_hvd, via_hc, wrapped = got["horovod"]
        assert wrapped, f"world {world}, rank {r}: hvd.DistributedOptimizer did not return hc's wrapper"
        for t, (a, b) in enumerate(zip(via_hvd, via_hc, strict=True)):
            assert torch.equal(a, b), f"world {world}, rank {r}, step {t}: hvd's and hc's runs differ"
            assert torch.equal(a, ranks[0]["horovod"][0][t]), f"world {world}, rank {r}, step {t}: differs from rank 0"


def test_powersgd_bits_do_not_depend_on_where_the_bucket_starts() -> None:
    """A bucket is a view that may start anywhere in the fused gradient buffer, where torch's hook works in DDP's own
    bucket buffer; a BLAS product may round by where its matrix starts (MKL's matrix-vector product at r = 1 does).
    One rank (the allreduces are the identity), 3 compressed steps: the same bits at every float offset."""
    shapes, numel = [(40, 60), (60,)], 40 * 60 + 60
    grads = [torch.randn(numel, generator=torch.Generator().manual_seed(t)) for t in range(3)]
    for rank_r in (1, 2, 4):
        runs = []
        for offset in range(8):
            state = PowerSGDState(PowerSGDOptions(rank_r, start_powerSGD_iter=0, random_seed=7))
            fused = torch.zeros(offset + numel)
            steps = []
            for g in grads:
                flat = fused[offset:]
                flat.copy_(g)
                reduce_bucket(TorchMatrices(), state, 0, flat, shapes, lambda tensor, average, what: None)
                state.step_done()
                steps.append([flat.clone(), state.errors[0].clone(), state.p_memory[0].clone(),
                              state.q_memory[0].clone()])
            runs.append(steps)
        for offset, steps in enumerate(runs[1:], 1):
            for t, (got, want) in enumerate(zip(steps, runs[0], strict=True)):
                for what, a, b in zip(("result", "error", "P", "Q"), got, want, strict=True):
                    assert torch.equal(a, b), (f"r {rank_r}, bucket at float offset {offset}, step {t}: {what} differs "
                                               f"from the aligned bucket's by {float((a - b).abs().max()):.3g}")


BAD = {
    "rank0": ("ValueError", "matrix_approximation_rank"),
    "rank_float": ("ValueError", "matrix_approximation_rank"),
    "start_negative": ("ValueError", "start_powerSGD_iter"),
    "rate_negative": ("ValueError", "min_compression_rate"),
    "feedback_str": ("ValueError", "use_error_feedback"),
    "warm_none": ("ValueError", "warm_start"),
    "eps_nan": ("ValueError", "orthogonalization_epsilon"),
    "seed_negative": ("ValueError", "random_seed"),
    "unknown": ("TypeError", "matrix_approximation_rank, start_powerSGD_iter"),
    "predivide": ("ValueError", "gradient_predivide_factor"),
    "topk": ("ValueError", "compresses its own way"),
    "bucket": ("ValueError", "bucket_mb"),
    "load_other_options": ("ValueError", "PowerSGD options"),
    "allreduce": ("ValueError", "op PowerSGD is an optimizer algorithm"),
}


def test_powersgd_bad_options_raise_on_every_rank(run) -> None:
    world, _, ranks = run
    for r, got in enumerate(ranks):
        for case, (kind, text) in BAD.items():
            outcome = got["bad"][case]
            assert outcome.startswith(kind) and text in outcome, f"world {world}, rank {r}, {case}: {outcome}"
