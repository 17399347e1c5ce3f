"""The plain-torch versions of the GPU kernels' work and the PCIe copies, timed on this machine's GPU (16M float32,
median of 20 after warm-up, CUDA events): what tools/gpu_check.sh sets the core's kernels against. One ROW line
each (tools/gpu_check_table.py)."""
import statistics

import torch

N = 1 << 24


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main():
    dev = torch.device("cuda")
    g = torch.randn(N, device=dev)
    err = torch.zeros(N, device=dev)
    m, b = torch.zeros(N, device=dev), torch.ones(N, device=dev)
    weights = (2 ** torch.arange(8, device=dev, dtype=torch.uint8)).view(1, 8)
    pinned, pinned_small = torch.empty(N, pin_memory=True), torch.empty(N // 32, pin_memory=True)

    def onebit():  # error feedback + scale + sign bits packed 8 per byte
        c = g + err
        scale = c.norm() / N ** 0.5
        bits = c >= 0
        err.copy_(c - scale * (bits.float() * 2 - 1))
        return (bits.view(-1, 8).to(torch.uint8) * weights).sum(1, dtype=torch.uint8)

    def stochastic():  # Birder's quantizer with moments, torch's generator
        m.mul_(0.95).add_(g, alpha=0.05)
        b.mul_(0.95).add_(g.abs(), alpha=0.05)
        y = m / (b + 1e-8) + err
        q = torch.where(torch.rand_like(y) < (y + 1) * 0.5, 1.0, -1.0)
        err.copy_(y - q)
        return (q > 0).view(-1, 8).to(torch.uint8).mul(weights).sum(1, dtype=torch.uint8)

    def mask_gather():
        return g[torch.rand(N, device=dev) < 0.1]

    p = torch.nn.Parameter(torch.randn(N, device=dev))
    p.grad = torch.randn(N, device=dev)
    adam = torch.optim.Adam([p], lr=1e-3, fused=True)
    rows = {
        "torch 1-bit compress+pack": onebit,
        "torch stochastic quantize + moments": stochastic,
        "torch Bernoulli mask + gather k=0.1": mask_gather,
        "torch fused Adam step": adam.step,
        "device copy 64 MB": lambda: err.copy_(g),
        "D2H 64 MB pinned": lambda: pinned.copy_(g, non_blocking=True),
        "D2H 2 MB pinned (1-bit payload)": lambda: pinned_small.copy_(g[: N // 32], non_blocking=True),
        "H2D 64 MB pinned": lambda: g.copy_(pinned, non_blocking=True),
    }
    for name, fn in rows.items():
        print(f"ROW\tspeed\t{name}\t{N}\t{timed(fn):.4f}\t{torch.cuda.get_device_name()}, torch {torch.__version__}",
              flush=True)


if __name__ == "__main__":
    main()
