"""Every op through hc.DistributedOptimizer, and broadcast_parameters, on the plain CPU device and on the staged test
device (cpp/include/hvdc/staged_device.h, selected by the private ``runtime._set_test_device``): the parameters after
every step, and the host bytes the staged run copied (``comm_stats()["host_bytes"]``). Then the 1-bit, the dense,
SLAMB's masked and DiLoCo's block-quantized allreduce, the flat hierarchical 1-bit collective, allgather and a top-k
allreduce called directly: their host bytes per call against their payload, and their outcome with one copy or one
wait dropped on rank 0. Also: hvd_compress._cuda's device table registered once (where the module is built). Saves
one dict per rank.

argv: out_dir.
"""

import torch
from common import save, small_wrapped

import hvd_compress.torch as hc
from hvd_compress.ops import block_quant, hierarchical_onebit, masks, onebit, runtime

hc.init()
torch.set_num_threads(1)
r = hc.rank()
STEPS = 4
OPTIONS = {"OneBitAdam": {"freeze_step": 1}, "OneBitLamb": {"freeze_step": 1},
           "ZeroOneAdam": {"var_freeze_step": 1, "local_step_scaler": 1, "local_step_clipper": 1},
           "Average": {}, "Sum": {}, "PowerSGD": {"start_powerSGD_iter": 1, "min_compression_rate": 1},
           "SignSGD": {}, "Adasum": {}, "Birder": {}, "SLAMB": {"compress_ratio": 0.5, "sync_interval": 3, "seed": 1},
           "DiLoCo": {"sync_every": 2, "fragments": 2, "outer_compression": "int4"},
           # The hierarchical 1-bit collective at one node of every rank (its node stages on the device too), and the
           # sparse allreduce of compression= (random-k and DGC: cpp/tests/test_device_table.cc).
           "OneBitAdam hierarchical": {"freeze_step": 1, "hierarchical": True},
           "topk": {"compression": hc.Compression.topk(0.3)}}
# One 1-bit call copies to the host twice (phase 1's blocks, the served block), to the device twice (the gathered
# blocks, the result's) and waits three times; one dense call copies each way once and waits twice.
DROPS = {"onebit": (("to_host", 0), ("to_host", 1), ("to_device", 0), ("to_device", 1), ("wait", 0), ("wait", 1),
                    ("wait", 2)),
         "dense": (("to_host", 0), ("to_device", 0), ("wait", 0), ("wait", 1)),
         # SLAMB's masked allreduce: its dense average's copies and the waits that stream order needs (the one after
         # the copy back is followed by the scatter on the stream, so dropping it changes nothing).
         "masked": (("to_host", 0), ("to_device", 0), ("wait", 0), ("wait", 2)),
         # The block-quantized allreduce: the compressed chunks and the server's chunk out, the received chunks and
         # the result in, the waits after each copy out and the last one.
         "block_quant": (("to_host", 0), ("to_host", 1), ("to_device", 0), ("to_device", 1), ("wait", 0),
                         ("wait", 1), ("wait", 2)),
         # The flat hierarchical call: bits out, pieces in, served piece out, chunk in; the first wait reads the bits.
         "hierarchical": (("to_host", 0), ("to_device", 0), ("wait", 0)),
         "allgather": (("to_host", 0), ("wait", 0)),
         "topk": (("to_host", 0), ("to_device", 0), ("wait", 0))}
NUMEL = 1000


def flat(model: torch.nn.Module) -> bytes:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()


def wrapped(op: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    if op == "topk":
        return small_wrapped("Average", **OPTIONS[op])
    if op != "SignSGD":
        return small_wrapped(op.split(maxsplit=1)[0], **OPTIONS[op])
    model, _ = small_wrapped("Average")  # its model; EF-signSGD wraps plain SGD
    base = torch.optim.SGD(model.parameters(), lr=0.05)
    return model, hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=hc.SignSGD)


def train(op: str) -> list[bytes]:
    model, opt = wrapped(op)
    g = torch.Generator().manual_seed(10 + r)
    trace = []
    for _ in range(STEPS):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        trace.append(flat(model))
    return trace


def broadcast() -> bytes:
    model, _ = small_wrapped("Average")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(r))
    hc.broadcast_parameters(model.state_dict(), root_rank=hc.size() - 1)
    return flat(model)


def call(kind: str, keep: list) -> bytes:  # noqa: PLR0911 (a return per kind of call)
    """One call of ``kind`` on rank-dependent input: every buffer it changed, as the call returns. The buffers go
    to ``keep``: after a dropped wait, kernels are still queued on them."""
    g = torch.Generator().manual_seed(r)
    x = torch.randn(NUMEL, generator=g)
    keep.append(x)
    if kind == "dense":
        hc.allreduce_(x, op=hc.Sum, name="dense")
        return x.numpy().tobytes()
    if kind == "allgather":  # rank r's r + 1 rows of 3 float32
        rows = x[: 3 * (r + 1)].reshape(r + 1, 3)
        return hc.allgather(rows, name="rows").numpy().tobytes()
    if kind == "topk":
        topk = hc.Compression.topk(0.1)
        state = hc.CompressionState(NUMEL, topk)
        keep.append(state)
        out = hc.allreduce(x, compression=topk, state=state, name="topk")
        return out.numpy().tobytes() + state.error.numpy().tobytes()
    if kind == "hierarchical":  # flat: the world is one level of nodes of one rank
        werr_n, serr_n = hierarchical_onebit.state_numels(NUMEL, False)
        werr, serr = torch.zeros(werr_n), torch.zeros(serr_n)
        keep += [werr, serr]
        hierarchical_onebit.hierarchical_compressed_allreduce_(x, werr, serr, hierarchical=False, seed=5)
        return x.numpy().tobytes() + werr.numpy().tobytes() + serr.numpy().tobytes()
    if kind == "masked":
        mask = torch.zeros(NUMEL, dtype=torch.bool)
        keep.append(mask)
        masks.masked_allreduce_(x, 0.3, 5, 2, "cyclic", always=(0, 3), mask_out=mask, check_finite=True)
        return x.numpy().tobytes() + mask.numpy().tobytes()
    if kind == "block_quant":
        err = torch.randn(NUMEL, generator=g) * 0.01
        keep.append(err)
        block_quant.block_quant_allreduce_(x, 4, err)
        return x.numpy().tobytes() + err.numpy().tobytes()
    werr = torch.randn(NUMEL, generator=g) * 0.1
    serr = torch.zeros(onebit.server_error_numel(NUMEL, hc.size()))
    keep += [werr, serr]
    onebit.compressed_allreduce_(x, werr, serr)
    return x.numpy().tobytes() + werr.numpy().tobytes() + serr.numpy().tobytes()


def payload(kind: str, plain: bytes) -> int:
    """The host bytes one direct call of ``kind`` must copy: exactly its payload."""
    n = hc.size()
    onebit_chunk = -(-NUMEL // (8 * n)) * 8  # the 1-bit call's padded chunk
    quant_chunk = -(-NUMEL // (64 * n)) * 64  # ceil(NUMEL / n) in whole blocks of 64
    return {
        "dense": 2 * 4 * NUMEL,  # the tensor out and back
        "onebit": (3 * n + 1) * (4 + onebit_chunk // 8),  # (3n + 1) wire blocks: a float32 scale and C / 8 bytes
        # the worker's bits out, n pieces of C / 8n bytes in, the served piece out, the bits in
        "hierarchical": (3 * n + 1) * -(-NUMEL // (8 * n)),
        "allgather": 12 * (r + 1),  # this rank's r + 1 rows of 12 bytes out
        "topk": 8 * 100 * (1 + n),  # k = 100 pairs of 8 bytes out, n k in
        "masked": 2 * 4 * sum(plain[4 * NUMEL:]),  # the selected values out and back (the mask: the second half)
        # (3n + 1) chunks of int4 blocks: a float32 scale and 32 bytes per 64 elements
        "block_quant": (3 * n + 1) * quant_chunk // 64 * (4 + 32),
    }[kind]


def plain_and_staged(run) -> tuple[object, object, int]:
    """``run()`` on the CPU's device and on the staged one; the host bytes of the staged run."""
    plain = run()
    runtime._set_test_device("staged")
    hc.comm_stats(reset=True)
    staged = run()
    host = hc.comm_stats(reset=True)["host_bytes"]
    runtime._set_test_device("")
    return plain, staged, host


out: dict = {"ops": {}, "calls": {}, "drops": {}}
try:  # hvd_compress._cuda's table registers without a GPU (it touches none until a collective runs on it)
    table = runtime.cuda_device_table()
    out["cuda_table"] = table is runtime.cuda_device_table() and "hvdc.DeviceTable" in repr(table)
except ImportError as e:
    out["cuda_table"] = f"ImportError: {e}"
cases = {"broadcast_parameters": broadcast, **{op: (lambda op=op: train(op)) for op in OPTIONS}}
for name, run in cases.items():
    plain, staged, host = plain_and_staged(run)
    out["ops"][name] = {"same": plain == staged, "host_bytes": host}
for kind, drops in DROPS.items():
    plain, staged, host = plain_and_staged(lambda kind=kind: call(kind, []))
    out["calls"][kind] = {"same": plain == staged, "host_bytes": host, "payload": payload(kind, plain)}
    for fault, index in drops:
        # Only rank 0 drops; every rank is on the staged device.
        runtime._set_test_device("staged", fault if r == 0 else "", index)
        keep: list = []
        try:
            dropped = call(kind, keep)
        except RuntimeError as e:  # poisoned top-k indices: every rank raises (hvdc CommError)
            dropped = repr(e).encode()
        runtime._set_test_device("")  # waits for what a dropped wait left queued, before `keep` goes
        out["drops"][f"{kind} {fault}#{index}"] = dropped == plain
save(r, out)
