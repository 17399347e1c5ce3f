"""hc.DistributedOptimizer(op=hc.PowerSGD) beside torch's own powerSGD_hook on the same gradients, one process per
rank: torch.distributed (gloo) is initialised beside MPI from the MPI rank and size. Each rank saves, per step, the
reduced gradients, P, Q and error of both (one bucket, and 2 KiB buckets), bytes sent; a run resumed from a mid-run
state_dict(); a model trained with overlap on and off; hvd.DistributedOptimizer(op=hc.PowerSGD); the outcome of
bad options. argv: out_dir, port, matrix_approximation_rank."""

from __future__ import annotations

import io
import os
import sys

import torch
import torch.distributed as dist
from common import outcome, save
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

import hvd_compress.torch as hc

# Matrices of several shapes (two alike, so the hook's grouping by shape matters), a 4-d one (viewed as 16 x 36),
# and tensors too small or too thin to compress (averaged dense). The matrices are large enough to be compressed at
# rank 4 too ((rows + cols) * 4 * min_compression_rate < rows * cols), so every rank tested sends a fraction. The
# last vector fills a 2 KiB bucket alone, the first reduced: a bucket with nothing to compress still draws its seed.
SHAPES = [(48, 32), (32,), (16, 4, 3, 3), (48, 32), (3, 2), (40, 60), (60,), (600,)]
STEPS, START, RESUME_AT = 6, 2, 4
INF_AT = (1, 3)  # (rank, step) whose first gradient gets an inf in the run "inf"
UNFROZEN_AT = 4  # the first step whose first gradient is not zero on every rank in the run "frozen"


class Bucket:
    """What powerSGD_hook reads of a dist.GradBucket (which has no Python constructor): bucket ``index`` of
    ``count``, holding the gradients in order, as our engine's bucket of that index holds them."""

    def __init__(self, grads: list[torch.Tensor], index: int, count: int) -> None:
        self._index, self._count = index, count
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views, offset = [], 0
        for g in grads:
            self._views.append(self._buffer[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._index == self._count - 1


def gradients(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    # A low-rank part shared by all ranks plus rank noise: the power iteration has a spectrum to find.
    out = []
    for i, shape in enumerate(SHAPES):
        base = torch.Generator().manual_seed(i)
        g = torch.randn(shape, generator=base) + 0.3 * torch.randn(shape, generator=gen)
        out.append(g)
    return out


def options(rank_r: int) -> dict:
    return {"matrix_approximation_rank": rank_r, "start_powerSGD_iter": START, "min_compression_rate": 2,
            "use_error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 0, "random_seed": 7}


def with_inf(rank: int, step: int) -> list[torch.Tensor]:
    """``gradients``, with an inf in the first (compressed) gradient of rank and step ``INF_AT``."""
    grads = gradients(rank, step)
    if (rank, step) == INF_AT:
        grads[0][0, 0] = float("inf")
    return grads


def frozen_first(rank: int, step: int) -> list[torch.Tensor]:
    """``gradients``, with the first (compressed) gradient zero on every rank before step ``UNFROZEN_AT`` (a layer
    unfrozen then, as in gradual unfreezing)."""
    grads = gradients(rank, step)
    if step < UNFROZEN_AT:
        grads[0].zero_()
    return grads


def ours(rank: int, rank_r: int, params: list[torch.nn.Parameter], steps: range, state: dict | None = None,
         bucket_mb: float = 25.0, grads_of=gradients) -> tuple[list[dict], dict | None, list[list[int]]]:
    """Our steps on ``grads_of(rank, step)``; the checkpoint taken at RESUME_AT; the parameter indices of each
    bucket (the engine's plan)."""
    opt = hc.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), op=hc.PowerSGD,
                                  overlap=False, bucket_mb=bucket_mb, **options(rank_r))
    bucket_of = opt._hvdc.bucket_of
    spans = [[i for i, p in enumerate(params) if bucket_of[id(p)] == b] for b in range(len(opt._hvdc.buckets))]
    if state is not None:
        opt.load_state_dict(state)
    out, saved = [], None
    for t in steps:
        if t == RESUME_AT:
            buf = io.BytesIO()
            torch.save(opt.state_dict(), buf)
            saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        for p, g in zip(params, grads_of(rank, t), strict=True):
            p.grad = g
        opt.comm_stats()
        opt.synchronize()
        st = opt.powersgd_state
        out.append({"grads": [p.grad.clone() for p in params], "bytes": opt.comm_stats(),
                    **{key: {b: v.clone() for b, v in d.items()}
                       for key, d in (("error", st.errors), ("p", st.p_memory), ("q", st.q_memory))}})
        with opt.skip_synchronize():
            opt.step()
        out[-1]["params"] = [p.detach().clone() for p in params]
        opt.zero_grad()
    return out, saved, spans


def theirs(rank: int, rank_r: int, spans: list[list[int]]) -> list[dict]:
    """torch's hook on the same gradients, over buckets holding the parameters of ``spans``, in bucket order."""
    state = PowerSGDState(process_group=None, **options(rank_r))
    out = []
    for t in range(STEPS):
        grads = gradients(rank, t)
        reduced: list[torch.Tensor | None] = [None] * len(grads)
        for b, span in enumerate(spans):
            bucket = Bucket([grads[i] for i in span], b, len(spans))
            powerSGD_hook(state, bucket).wait()
            for i, v in zip(span, bucket.gradients(), strict=True):
                reduced[i] = v.clone()
        out.append({"grads": reduced,
                    **{key: {b: v.clone() for b, v in d.items()} for key, d in
                       (("error", state.error_dict), ("p", state.p_memory_dict), ("q", state.q_memory_dict))}})
    return out


def trained(rank: int, overlap: bool, passes: int) -> list[torch.Tensor]:
    """A small MLP trained 5 steps (PowerSGD from step 2) by real backward passes, ``passes`` per step: its
    parameters after each step. Overlap on and off must give the same bits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(), op=hc.PowerSGD,
                                  backward_passes_per_step=passes, overlap=overlap,
                                  matrix_approximation_rank=2, start_powerSGD_iter=2)
    gen = torch.Generator().manual_seed(rank)
    out = []
    for _ in range(5):
        for _ in range(passes):
            x, y = torch.randn(8, 12, generator=gen), torch.randn(8, 3, generator=gen)
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        out.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return out


def via_horovod(rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
    """Horovod's own entry point after hvd.init(): hvd.DistributedOptimizer(op=hc.PowerSGD) runs hc's, so a
    Horovod script changes its op only. (parameters per step through hvd, through hc, whether hvd returned ours)"""
    import horovod.torch as hvd

    from hvd_compress.torch.wrapping import wrapped_engine

    hvd.init()
    runs, wrapped = [], False
    for make in (hvd.DistributedOptimizer, hc.DistributedOptimizer):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        opt = make(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(),
                   op=hc.PowerSGD, matrix_approximation_rank=1, start_powerSGD_iter=1)
        wrapped = wrapped or (make is hvd.DistributedOptimizer and wrapped_engine(opt) is not None)
        gen = torch.Generator().manual_seed(rank)
        steps = []
        for _ in range(3):
            x, y = torch.randn(8, 12, generator=gen), torch.randn(8, 3, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        runs.append(steps)
    return runs[0], runs[1], wrapped


def bad_options() -> dict[str, str]:
    def wrap(**kw):
        p = torch.nn.Parameter(torch.zeros(8, 8))
        return hc.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), op=hc.PowerSGD, **kw)

    cases = {
        "rank0": {"matrix_approximation_rank": 0},
        "rank_float": {"matrix_approximation_rank": 1.5},
        "start_negative": {"start_powerSGD_iter": -1},
        "rate_negative": {"min_compression_rate": -1.0},
        "feedback_str": {"use_error_feedback": "yes"},
        "warm_none": {"warm_start": None},
        "eps_nan": {"orthogonalization_epsilon": float("nan")},
        "seed_negative": {"random_seed": -3},
        "unknown": {"compression_rank": 2},
        "predivide": {"gradient_predivide_factor": 2.0},
        "topk": {"compression": hc.Compression.topk(0.1)},
        "bucket": {"bucket_mb": 0},
    }
    out = {name: outcome(lambda kw=kw: wrap(**kw)) for name, kw in cases.items()}
    # A checkpoint of other options: refused before anything changes.
    p = torch.nn.Parameter(torch.zeros(8, 8))
    a = hc.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), op=hc.PowerSGD, matrix_approximation_rank=1)
    b = hc.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), op=hc.PowerSGD, matrix_approximation_rank=2)
    out["load_other_options"] = outcome(lambda: b.load_state_dict(a.state_dict()))
    out["allreduce"] = outcome(lambda: hc.allreduce(torch.zeros(4), op=hc.PowerSGD))
    return out


def main() -> None:
    port, rank_r = sys.argv[2], int(sys.argv[3])
    hc.init()
    rank, size = hc.rank(), hc.size()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.manual_seed(0)
    init = [torch.randn(s) for s in SHAPES]
    params = [torch.nn.Parameter(x.clone()) for x in init]
    runs, saved, spans = ours(rank, rank_r, params, range(STEPS))
    # Resume: fresh parameters equal to the run's after step RESUME_AT - 1, the checkpoint taken then.
    params2 = [torch.nn.Parameter(x.clone()) for x in runs[RESUME_AT - 1]["params"]]
    resumed, _, _ = ours(rank, rank_r, params2, range(RESUME_AT, STEPS), state=saved)
    # Buckets of 2 KiB: several, each with its own error, P and Q, their random Q drawn in bucket order.
    params3 = [torch.nn.Parameter(x.clone()) for x in init]
    small, _, small_spans = ours(rank, rank_r, params3, range(STEPS), bucket_mb=2 / 1024)
    # The same with an inf on one rank at one step: that bucket's state stays, the other buckets go on.
    params4 = [torch.nn.Parameter(x.clone()) for x in init]
    inf, _, _ = ours(rank, rank_r, params4, range(STEPS), bucket_mb=2 / 1024, grads_of=with_inf)
    params5 = [torch.nn.Parameter(x.clone()) for x in init]
    frozen, _, _ = ours(rank, rank_r, params5, range(STEPS), bucket_mb=2 / 1024, grads_of=frozen_first)
    runs_trained = {(overlap, passes): trained(rank, overlap, passes) for overlap in (True, False) for passes in (1, 2)}
    save(rank, {
        "ours": runs, "theirs": theirs(rank, rank_r, spans), "spans": spans, "resumed": resumed, "small": small,
        "small_theirs": theirs(rank, rank_r, small_spans), "small_spans": small_spans, "trained": runs_trained,
        "inf": inf, "inf_inputs": [with_inf(rank, t) for t in range(STEPS)],
        "frozen": frozen, "frozen_inputs": [frozen_first(rank, t) for t in range(STEPS)],
        "horovod": via_horovod(rank), "bad": bad_options(), "inputs": [gradients(rank, t) for t in range(STEPS)],
    })
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
