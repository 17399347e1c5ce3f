"""Every public op of the PyTorch face on CUDA tensors, at the ranks mpirun started (tools/gpu_check.sh runs 2 on
one GPU). One ROW line per case on rank 0 (tools/gpu_check_table.py renders them): PASS with the result,
REFUSED where every rank raised the core's "CPU tensors only" refusal (what a build without the CUDA path says),
FAIL for any other exception or for ranks that disagree."""
import time

import torch
from mpi4py import MPI

import hvd_compress.torch as hc

REFUSAL = "CPU tensors only"


def attempt(name, fn):
    t0 = time.perf_counter()
    try:
        out = ("PASS", str(fn()))
    except Exception as e:  # report, then go on with the next case
        out = ("REFUSED" if REFUSAL in str(e) else "FAIL", f"{type(e).__name__}: {str(e)[:200]}")
    seen = MPI.COMM_WORLD.gather(out, root=0)
    if hc.rank() == 0:
        status = seen[0][0] if all(s[0] == seen[0][0] for s in seen) else "FAIL"
        detail = "; ".join(f"rank {r}: {d}" for r, (_, d) in enumerate(seen)) if status == "FAIL" else seen[0][1]
        print(f"ROW\tprobe\t{name}\t{hc.size()} ranks\t{status}\t{detail} ({time.perf_counter() - t0:.2f} s)",
              flush=True)
    MPI.COMM_WORLD.Barrier()


def full(value, n=1 << 20):
    return torch.full((n,), float(value), device="cuda")


def train(op, steps=8):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    kw = dict(freeze_step=3) if op in ("OneBitAdam", "OneBitLamb") else {}
    if op in ("OneBitLamb", "SLAMB"):
        base = hc.Lamb(m.parameters(), lr=1e-2)
    elif op == "Birder":
        base = hc.Birder(m.parameters(), lr=1e-3)
    else:
        base = torch.optim.Adam(m.parameters(), lr=1e-3)
    opt = hc.DistributedOptimizer(base, named_parameters=m.named_parameters(), op=getattr(hc, op), **kw)
    g = torch.Generator().manual_seed(hc.rank())
    for _ in range(steps):
        opt.zero_grad()
        loss = m(torch.randn(32, 64, generator=g).cuda()).pow(2).mean()
        loss.backward()
        opt.step()
    return f"loss {float(loss):.4f}, parameters on {next(m.parameters()).device}"


def main():
    hc.init()
    r = hc.rank()
    attempt("allreduce Average", lambda: float(hc.allreduce(full(r + 1), op=hc.Average)[0]))
    attempt("allreduce Sum", lambda: float(hc.allreduce(full(r + 1), op=hc.Sum)[0]))
    attempt("allreduce Adasum", lambda: float(hc.allreduce(full(r + 1), op=hc.Adasum)[0]))
    attempt("allreduce fp16 compression",
            lambda: float(hc.allreduce(full(r + 1), op=hc.Average, compression=hc.Compression.fp16)[0]))
    attempt("allreduce top-k compression",
            lambda: float(hc.allreduce(full(r + 1), op=hc.Average, compression=hc.Compression.topk(0.01),
                                       state=hc.CompressionState(1 << 20, hc.Compression.topk(0.01), "cuda")).sum()))
    attempt("allreduce_async", lambda: float(hc.synchronize(hc.allreduce_async(full(r + 1)))[0]))
    attempt("compressed_allreduce", lambda: float(hc.compressed_allreduce(
        full(r + 1), hc.OneBitState(1 << 20, torch.float32, device="cuda"))[0]))
    attempt("masked_allreduce", lambda: float(hc.masked_allreduce(full(r + 1), 0.1, 7, 0).sum()))
    attempt("grouped_allreduce", lambda: [float(t[0]) for t in hc.grouped_allreduce([full(r), full(2 * r, 7)])])
    attempt("broadcast", lambda: float(hc.broadcast(full(r + 5), root_rank=0)[0]))
    attempt("allgather", lambda: tuple(hc.allgather(full(r, 3)).shape))
    attempt("broadcast_parameters", lambda: hc.broadcast_parameters(
        torch.nn.Linear(8, 8).cuda().state_dict(), root_rank=0))
    for op in ("Average", "Adasum", "OneBitAdam", "OneBitLamb", "SLAMB", "Birder"):
        attempt(f"DistributedOptimizer op={op}", lambda op=op: train(op))


if __name__ == "__main__":
    main()
