"""Where 0/1 Adam's held-out loss on the e2e bench's MLP parts from dense Adam's: the held-out loss every
``--every`` steps of 0/1 Adam at several sync intervals, against dense Adam, and two ablations that take one
piece of the rule away at a time:

- v frozen: one process, the ranks' batches as one (``e2e.dense_reference``'s, which gives the plain Adam row),
  Adam whose v stops at step ``--freeze``, bias-corrected, under a variance floor and cap shaped as 0/1 Adam's
  (spec Z12, Z17; the floor here a share of each layer's mean v only, not also of the bucket's): the variance
  freeze alone, with no compression and no local steps;
- ``exact``: 0/1 Adam with its 1-bit exchange replaced by an exact average of the same buffer (the rule's
  local steps and frozen v without the compression error);
- ``reset``: 0/1 Adam with ``reset_momentum_at_sync`` (spec Z18: m = 0 after each sync, not ubar / lrs);
- ``exact-reset``: both, which leaves the reset's local steps and frozen v without the compression error;
- ``block-reset``: the reset with the 1-bit exchange's one scale per chunk (a quarter of a bucket at 4 ranks)
  replaced by one per ``--block`` elements, worker and server side alike (a simulation in torch, not the core's
  exchange: what a finer scale would buy, at 32 / block more bits per element).

No link is emulated (held-out loss does not depend on step time). Four ranks:

    mpirun -np 4 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x PYTHONPATH=$PWD \\
        python3 tools/zero_one_heldout.py --seeds 0,1,2 --intervals 1,4,16 --exact 1,16 --reset 16

It prints its figures and writes no result file; docs/algorithms/zero-one-adam.md quotes one run.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from mpi4py import MPI
from torch import nn

import hvd_compress.torch as hc
from hvd_compress import ops
from hvd_compress.algorithms import zero_one_adam
from hvd_compress.algorithms.onebit import DEFAULT_VARIANCE_FLOOR
from hvd_compress.bench.e2e import dense_reference
from hvd_compress.bench.models import build, digits
from hvd_compress.ops.constants import ReduceOp

BATCH, LR, BETAS, EPS = 32, 1e-3, (0.9, 0.999), 1e-8
ONEBIT_EXCHANGE = zero_one_adam.compressed_allreduce_


def _exact_average(work, *_state, **kwargs):
    """The ablation's exchange: the exact average of what 0/1 Adam would compress (its error buffers unused)."""
    return ops.allreduce_(work, op=ReduceOp.Average, **kwargs)


def _block_signs(c: torch.Tensor, block: int) -> torch.Tensor:
    """+/- the root mean square of each run of ``block`` elements of ``c`` (the last run shorter): the 1-bit
    compressor's rule with a finer scale."""
    pad = (-c.numel()) % block
    padded = torch.nn.functional.pad(c, (0, pad)).view(-1, block)
    counts = torch.full((padded.shape[0], 1), float(block))
    counts[-1] = block - pad
    scale = (padded.square().sum(1, keepdim=True) / counts).sqrt()
    return torch.where(padded >= 0, scale, -scale).view(-1)[: c.numel()]


def _block_exchange(block: int, server_errors: dict[int, torch.Tensor]):
    """An error-compensated 1-bit average with one scale per ``block`` elements: each rank compresses its x + e,
    the compressed values are averaged exactly, and the average is compressed again with a server error (every
    rank holds the same average, so each keeps the whole server error in place of its chunk's)."""

    def exchange(work, worker_error, server_error, **_kwargs):
        c = work.float() + worker_error
        sent = _block_signs(c, block)
        worker_error.copy_(c - sent)
        ops.allreduce_(sent, op=ReduceOp.Average)
        err = server_errors.setdefault(id(server_error), torch.zeros_like(sent))
        c = sent + err
        out = _block_signs(c, block)
        err.copy_(c - out)
        return work.copy_(out)

    return exchange


def held_out(model: nn.Module, data) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(data.x_test), data.y_test))


def zero_one(seed: int, interval: int, exchange: str, args, data, rank: int, reset: bool = False) -> list[float] | str:
    """Rank 0's held-out losses of one 0/1 Adam run, or the error that stopped it."""
    zero_one_adam.compressed_allreduce_ = {"1-bit": ONEBIT_EXCHANGE, "exact": _exact_average,
                                           "block": _block_exchange(args.block, {})}[exchange]
    model = build("mlp", seed=seed)
    opt = hc.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR),
                                  named_parameters=model.named_parameters(), op=hc.ZeroOneAdam,
                                  var_freeze_step=args.freeze, local_step_scaler=1, local_step_clipper=interval,
                                  variance_bias_correction=True, reset_momentum_at_sync=reset)
    gen = torch.Generator().manual_seed(1000 + rank)  # the e2e bench's batches
    out: list[float] = []
    try:
        for step in range(1, args.steps + 1):
            idx = torch.randint(0, data.x_train.shape[0], (BATCH,), generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
            opt.step()
            if step % args.every == 0:
                out.append(held_out(model, data))
    except hc.UsageError as e:
        return f"stopped at step {step}: {str(e).split(':')[1].strip()}"
    finally:
        zero_one_adam.compressed_allreduce_ = ONEBIT_EXCHANGE
    return out


def adam(seed: int, args, data, size: int) -> list[float]:
    """torch's Adam on the ranks' batches as one, every ``--every`` steps."""
    run = argparse.Namespace(seed=seed, lr=LR, batch=BATCH)
    return dense_reference("adam", "mlp", data, run, size, args.steps)[args.every - 1::args.every]


def frozen_v(seed: int, args, data, size: int) -> list[float]:
    """Adam on the ranks' batches as one, v stopped after step ``--freeze`` under a floor and cap as 0/1 Adam's."""
    model = build("mlp", seed=seed)
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    gens = [torch.Generator().manual_seed(1000 + r) for r in range(size)]  # dense_reference's batches
    (b1, b2), out = BETAS, []
    for t in range(1, args.steps + 1):
        idx = torch.cat([torch.randint(0, data.x_train.shape[0], (BATCH,), generator=g) for g in gens])
        model.zero_grad()
        nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        frozen = t > args.freeze
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v, strict=True):
                mi.mul_(b1).add_(p.grad, alpha=1 - b1)
                if not frozen:
                    vi.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = mi / (1 - b1 ** t)
                v_hat = vi / (1 - b2 ** min(t, args.freeze))
                if frozen:  # d floored at a share of the layer's mean v, and there raised to |m|
                    floor = DEFAULT_VARIANCE_FLOOR * v_hat.mean()
                    d = v_hat.clamp(min=floor).sqrt().add_(EPS)
                    d = torch.where(v_hat < floor, torch.maximum(d, m_hat.abs()), d)
                else:
                    d = v_hat.sqrt().add_(EPS)
                p.addcdiv_(m_hat, d, value=-LR)
        if t % args.every == 0:
            out.append(held_out(model, data))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--freeze", type=int, default=15, help="var_freeze_step (the e2e bench's: its --warmup)")
    parser.add_argument("--intervals", default="1,4,16", help="local_step_clipper values (local_step_scaler 1)")
    parser.add_argument("--exact", default="1,16", help="intervals run again with an exact exchange")
    parser.add_argument("--reset", default="", help="intervals run again with reset_momentum_at_sync")
    parser.add_argument("--exact-reset", default="", help="intervals run again with both")
    parser.add_argument("--block-reset", default="", help="intervals run again with the reset and a scale per block")
    parser.add_argument("--block", type=int, default=256, help="elements per scale in --block-reset")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hc.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data = digits()
    runs = [(f"0/1 Adam, sync every {i}", int(i), "1-bit", False) for i in args.intervals.split(",") if i]
    runs += [(f"0/1 Adam, sync every {i}, exact", int(i), "exact", False) for i in args.exact.split(",") if i]
    runs += [(f"0/1 Adam, sync every {i}, m reset", int(i), "1-bit", True) for i in args.reset.split(",") if i]
    runs += [(f"0/1 Adam, sync every {i}, exact, m reset", int(i), "exact", True)
             for i in args.exact_reset.split(",") if i]
    runs += [(f"0/1 Adam, sync every {i}, 1-bit per {args.block}, m reset", int(i), "block", True)
             for i in args.block_reset.split(",") if i]
    finals: dict[str, list[float]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        rows = []
        if rank == 0:
            rows += [("Adam", adam(seed, args, data, size)),
                     (f"Adam, v frozen after {args.freeze}", frozen_v(seed, args, data, size))]
        rows += [(name, zero_one(seed, i, exchange, args, data, rank, reset)) for name, i, exchange, reset in runs]
        if rank == 0:
            for name, curve in rows:
                shown = curve if isinstance(curve, str) else " ".join(f"{x:.4f}" for x in curve)
                print(f"seed {seed} {name:46s} {shown}", flush=True)
                if not isinstance(curve, str):
                    finals.setdefault(name, []).append(curve[-1])
    if rank == 0:
        base = statistics.mean(finals["Adam"])
        print(f"final held-out loss, mean over the seeds that finished (vs Adam's mean {base:.4f}):")
        for name, xs in finals.items():
            print(f"  {name:46s} {statistics.mean(xs):.4f} ({statistics.mean(xs) / base - 1:+.0%}, {len(xs)} seeds)")


if __name__ == "__main__":
    main()
