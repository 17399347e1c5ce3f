"""Horovod's Adasum tests for PyTorch (test/parallel/test_adasum_pytorch.py, and test_delta_optimizer of
test/parallel/test_torch.py, Horovod 0.28), rewritten against hc on the CPU: the same data, seeds, dtypes, sizes
and tolerance (relative L2 error / 100 below the dtype's eps) as each Horovod test, one function per test, named
as in Horovod.

Horovod's expected value for parallel vectors (test_parallel, test_stability, test_stability_2) is their average,
which a tree of pairwise Adasum steps gives only at a power-of-two size. hc also runs at other sizes by folding
rank r >= p into rank r - p first (docs/algorithms/adasum.md), which weights the folded ranks differently; at such
sizes these tests compare with that fold (hvd_compress.reference.adasum) under Horovod's tolerance instead, and say so.

argv: out_dir, mode ("hc": hc.init() alone; "hvd": hvd.init() first). Each rank saves {test name: "ok", "ok
(...)" or what failed}.
"""

import math
import sys
import traceback

import horovod.torch as hvd
import numpy as np
import torch
from common import save

import hvd_compress.torch as hc
from hvd_compress.reference.adasum import adasum as reference_adasum

mode = sys.argv[2]
if mode == "hvd":
    hvd.init()
else:
    hc.init()
rank, size = hc.rank(), hc.size()
POWER_OF_TWO = size & (size - 1) == 0
DATA_TYPES = (np.float32, np.float16)  # as Horovod's TorchAdasumTests
results: dict[str, str] = {}


def ported(fn):
    """Run one ported test on this rank and record its outcome (every rank runs every test, in order)."""
    try:
        note = fn()
        results[fn.__name__] = "ok" if note is None else f"ok ({note})"
    except Exception as e:
        results[fn.__name__] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    return fn


def relative_error(want: np.ndarray, got: np.ndarray) -> float:
    """Horovod's diff_ratio: |want - got| / |want| / 100."""
    return float(np.linalg.norm(want - got) / np.linalg.norm(want) / 100.0)


def check(data_type, want: np.ndarray, got: torch.Tensor, what: str) -> None:
    err = relative_error(want, got.numpy().astype(np.float64))
    eps = float(np.finfo(data_type).eps)
    assert err < eps, f"{what} ({np.dtype(data_type).name}, n={size}): off by {err:.3g} >= eps {eps:.3g}"


def parallel_expectation(columns: np.ndarray, data_type) -> tuple[np.ndarray, str | None]:
    """Horovod's expected value (the average of the ranks' parallel vectors) at a power-of-two size; else hc's
    documented fold, from the NumPy reference."""
    if POWER_OF_TWO:
        return columns.sum(axis=1) / size, None
    dtype = np.dtype(data_type).name
    want = reference_adasum([columns[:, r] for r in range(size)], dtype=dtype)[rank]
    return want.astype(np.float64), f"n={size} is not a power of two: compared with the reference's fold"


@ported
def test_orthogonal():
    # Horovod runs this on GPUs only (its CPU Adasum path is the same MPI code); hc runs it on the CPU.
    # denominator: Horovod divides by local_size when NCCL is built (its hierarchical GPU Adasum); hc's flat
    # Adasum, as Horovod's CPU path, sums orthogonal vectors: 1.
    np.random.seed(2)
    torch.manual_seed(2)
    for data_type in DATA_TYPES:
        sizes = [size * 20 - 17, size * 2 + 1, size + 2, 2**19]
        columns, tensors = [], []
        for n in sizes:
            q, _ = np.linalg.qr(np.random.normal(0, 1, (n, size)).astype(np.float64))
            q = q.astype(data_type)
            columns.append(q.astype(np.float64))
            tensors.append(torch.from_numpy(np.ascontiguousarray(q[:, rank])))
        handles = [hc.allreduce_async(t, op=hc.Adasum) for t in tensors]
        reduced = [hc.synchronize(h) for h in handles]
        for n, q, got in zip(sizes, columns, reduced, strict=True):
            check(data_type, q.sum(axis=1), got, f"orthogonal N={n}")


@ported
def test_parallel():
    # GPU-only in Horovod, run on the CPU here (see test_orthogonal).
    np.random.seed(2)
    torch.manual_seed(2)
    note = None
    for data_type in DATA_TYPES:
        sizes = [size * 20 - 13, size * 2 + 1, size + 2, 2**19]
        columns, tensors = [], []
        for n in sizes:
            a = np.random.normal(0, 1, (n, 1)).astype(np.float64)
            scale = np.random.normal(0, 1, (size, 1)).astype(np.float64)
            q = (a @ scale.T).astype(data_type)
            columns.append(q.astype(np.float64))
            tensors.append(torch.from_numpy(np.ascontiguousarray(q[:, rank])))
        handles = [hc.allreduce_async(t, op=hc.Adasum) for t in tensors]
        reduced = [hc.synchronize(h) for h in handles]
        for n, q, got in zip(sizes, columns, reduced, strict=True):
            want, note = parallel_expectation(q, data_type)
            check(data_type, want, got, f"parallel N={n}")
    return note


@ported
def test_stability():
    np.random.seed(2)
    torch.manual_seed(2)
    note = None
    for data_type in DATA_TYPES:
        n = 1024
        a = np.random.normal(0, np.finfo(data_type).tiny, (n, 1)).astype(np.float64)  # tiny: products underflow
        scale = np.random.normal(0, 1, (size, 1)).astype(np.float64)
        q = (a @ scale.T).astype(data_type).astype(np.float64)
        tensor = torch.from_numpy(q[:, rank].astype(data_type))
        hc.allreduce_(tensor, op=hc.Adasum)
        want, note = parallel_expectation(q, data_type)
        check(data_type, want, tensor, "stability")
    return note


@ported
def test_stability_2():
    np.random.seed(2)
    torch.manual_seed(2)
    note = None
    for data_type in DATA_TYPES:
        n = 1024
        lo = float(np.finfo(data_type).tiny)
        hi = math.sqrt(float(np.finfo(data_type).max))
        a = np.random.normal(0, 1, (n, 1)).astype(np.float64)
        # rank i's scale: geometric steps from near tiny to sqrt(max), shuffled (the same on every rank)
        scale = np.array([hi ** ((i + 1) / size) * lo ** ((size - i - 1) / size) for i in range(size)])
        scale = scale.reshape(size, 1)
        np.random.shuffle(scale)
        q = (a @ scale.T).astype(data_type).astype(np.float64)
        tensor = torch.from_numpy(q[:, rank].astype(data_type))
        hc.allreduce_(tensor, op=hc.Adasum)
        want, note = parallel_expectation(q, data_type)
        check(data_type, want, tensor, "stability 2")
    return note


@ported
def test_delta_optimizer():
    # test_torch.py's Adasum optimizer test (GPU-only in Horovod; CPU here): one SGD step of a two-layer conv net on
    # a 1000x1000 input through DistributedOptimizer(op=Adasum). Horovod asserts only that it runs; added here: the
    # step moved every parameter and left them finite.
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 100, 1), torch.nn.Conv2d(100, 1, 1))
    inp = torch.rand([1, 1, 1000, 1000])
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hc.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hc.Adasum)
    loss = model(inp).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for (name, p), b in zip(model.named_parameters(), before, strict=True):
        assert torch.isfinite(p).all(), f"{name} not finite after the Adasum step"
        assert not torch.equal(p.detach(), b), f"{name} did not move"


save(rank, {"results": results})
