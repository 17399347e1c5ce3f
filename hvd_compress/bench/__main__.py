"""``python -m hvd_compress.bench``: median time of each hvd_compress collective and of Horovod's on
the same buffer, in one run, with their ratio; writes JSON and a markdown table.

Launch under mpirun (``make bench``, ``make bench NET=1gbit``). Each repetition starts after a
barrier and counts the slowest rank's time; ours and the baselines alternate, so drift on a noisy
machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from mpi4py import MPI

import hvd_compress.torch as hc
from hvd_compress.bench import tables
from hvd_compress.bench.cases import Case, cases
from hvd_compress.bench.kernels import kernel_isa, run_kernels
from hvd_compress.bench.slamb_cases import mask_kernel_rows
from hvd_compress.bench.stamp import stamp

MB = 1 << 20


def _timed(fn, buf: torch.Tensor, comm) -> float:
    comm.Barrier()
    start = time.perf_counter()
    fn(buf)
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX)


def run_case(case: Case, size_mb: float, comm, min_reps: int, max_reps: int, budget_s: float) -> dict:
    numel = int(size_mb * MB) // 4
    g = torch.Generator().manual_seed(hc.rank())
    src = torch.randn(numel, generator=g)
    impls = {"ours": case.ours, **case.baselines}
    bufs = {k: src.clone() for k in impls}
    times: dict[str, list[float]] = {k: [] for k in impls}
    for k, fn in impls.items():  # warm-up: buffers, communicators, Horovod's fusion setup
        bufs[k].copy_(src)
        _timed(fn, bufs[k], comm)
    hc.comm_stats()
    start = time.perf_counter()
    reps = 0
    while True:
        for k, fn in impls.items():
            bufs[k].copy_(src)
            times[k].append(_timed(fn, bufs[k], comm))
        reps += 1
        # Every rank must agree on whether to go on: a rank that tested its own clock alone could
        # leave the loop while another starts one more repetition, and the next collective mismatches.
        done = reps >= max_reps or (reps >= min_reps and time.perf_counter() - start > budget_s)
        if comm.allreduce(done, op=MPI.LOR):
            break
    stats = hc.comm_stats()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    first = next(iter(case.baselines))
    return {
        "collective": case.name,
        "size_mb": size_mb,
        "ranks": hc.size(),
        "reps": reps,
        "median_ms": med,
        "ratio_vs": {k: med["ours"] / med[k] for k in case.baselines},
        "ratio": med["ours"] / med[first],
        "bytes_sent_per_call": stats["bytes_sent"] // max(reps, 1),
        "dense_bytes": numel * 4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4,16,64", help="buffer sizes in MB")
    parser.add_argument("--only", default="", help="comma-separated collective names (default: all)")
    parser.add_argument("--out", default="bench_results")
    parser.add_argument("--label", default="shm")
    parser.add_argument("--min-reps", type=int, default=5)
    parser.add_argument("--max-reps", type=int, default=30)
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per (collective, size)")
    parser.add_argument(
        "--kernel-dtypes",
        default="float32,float16,bfloat16",
        help="dtypes of the 1-bit kernel micro-benchmark on rank 0 ('' skips it)",
    )
    args = parser.parse_args()

    hvd.init()
    hc.init()
    comm = MPI.COMM_WORLD
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    kdtypes = [d for d in args.kernel_dtypes.split(",") if d]
    krows = run_kernels(comm, [float(s) for s in args.sizes.split(",")], kdtypes) if kdtypes else []
    # The mask kernels on rank 0 (the others wait in the first collective below).
    mrows = mask_kernel_rows([float(s) for s in args.sizes.split(",")]) if hc.rank() == 0 else []
    rows = []
    for case in cases(hvd):
        if wanted and case.name not in wanted:
            continue
        for size in (float(s) for s in args.sizes.split(",")):
            rows.append(run_case(case, size, comm, args.min_reps, args.max_reps, args.budget))
            if hc.rank() == 0:
                r = rows[-1]
                print(f"[bench] {case.name} {size:g} MB: ours {r['median_ms']['ours']:.2f} ms, ratio {r['ratio']:.2f}",
                      flush=True)
    if hc.rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"bench_{args.label}_np{hc.size()}"
        result = {"stamp": stamp("collectives", "hvd_compress.bench", hc.size()), "label": args.label,
                  "rows": rows, "kernels": krows, "kernel_isa": kernel_isa(), "mask_kernels": mrows}
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
        table = tables.collectives(rows, args.label)
        table += "\n" + tables.kernels(krows, result["kernel_isa"]) if krows else ""
        table += "\n" + tables.mask_kernels(mrows)
        stem.with_suffix(".md").write_text(table)
        print(table)
        print(f"[bench] wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
