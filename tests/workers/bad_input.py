"""Each kind of bad input, on some ranks only; every rank records the exception it got."""

import os
import signal
import sys
import tempfile
import threading
import time

import torch
from common import outcome, save

import hvd_compress.torch as hc

case = sys.argv[2]
hc.init()
r, n = hc.rank(), hc.size()
caught: dict[str, str] = {}


def attempt(label, fn):
    caught[label] = outcome(fn)


if case == "dtype":
    # bool: no reduction takes it (integers are reduced since Min/Max/Product landed: int32 against float32 is
    # now a MismatchError, pinned in test_horovod_ported.py).
    x = torch.ones(5, dtype=torch.bool if r == n - 1 else torch.float32)
    attempt("dtype", lambda: hc.allreduce(x))
    y = torch.ones(3, dtype=torch.complex64)
    attempt("complex_all", lambda: hc.allreduce(y))
elif case == "device":
    x = torch.ones(5, device="meta" if r == 1 else "cpu")
    attempt("device", lambda: hc.allreduce_(x))
elif case == "shape":
    attempt("numel", lambda: hc.allreduce(torch.ones(4 + r)))
    attempt("dtype_mismatch", lambda: hc.allreduce(torch.ones(4, dtype=torch.float64 if r == 0 else torch.float32)))
    attempt("op_mismatch", lambda: hc.allreduce(torch.ones(4), op=hc.Sum if r == 0 else hc.Average))
    attempt("unknown_op", lambda: hc.allreduce(torch.ones(4), op=42))
elif case == "shape_2d":
    # The same element count in different shapes: [2, 3] on even ranks, [3, 2] on odd ones.
    shape = (2, 3) if r % 2 == 0 else (3, 2)
    attempt("allreduce", lambda: hc.allreduce(torch.ones(shape)))
    attempt("adasum", lambda: hc.allreduce(torch.ones(shape), op=hc.Adasum))
    attempt("grouped", lambda: hc.grouped_allreduce([torch.ones(4), torch.ones(shape)], op=hc.Adasum))
    attempt("broadcast", lambda: hc.broadcast_(torch.ones(shape), root_rank=0))
    attempt("compressed", lambda: hc.compressed_allreduce(torch.ones(shape), hc.OneBitState(6)))
elif case == "after_errors":
    attempt("numel", lambda: hc.allreduce(torch.ones(4 + r)))
elif case == "timeout":
    hc.set_timeout(2.0)
    if r == 0:
        start = time.monotonic()
        attempt("timeout", lambda: hc.allreduce(torch.ones(4)))
        caught["waited"] = f"{time.monotonic() - start:.1f}"
        attempt("after_timeout", lambda: hc.allreduce(torch.ones(4)))
    else:
        time.sleep(6)  # a peer stuck elsewhere
        caught["timeout"] = "peer"
    save(r, {"caught": caught})
    sys.stdout.flush()
    os._exit(0)  # rank 0 holds a request that can never complete; MPI_Finalize would wait for it
elif case in ("stall", "stall-max"):
    # Rank 1 stops (SIGSTOP) while both ranks are inside large allreduces: rank 0 then waits in a
    # transfer of a collective every rank had joined, and must end the job after HVDC_TIMEOUT
    # instead of waiting forever. A stop that lands in a signature exchange (a tiny part of each
    # call) gives the agreement's CommTimeoutError instead, recorded here.
    hc.set_timeout(3.0)
    # 64 MB: a ring allreduce (Sum), or MPI_Iallreduce in chunks (Max); the data phase far longer than the agreement
    x = torch.ones(16 << 20)
    op = hc.Max if case == "stall-max" else hc.Sum
    hc.allreduce(torch.ones(4))  # both ranks start the loop together
    if r == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    try:
        # No work between the calls (a Sum overflowing to inf is harmless): the stop should land in a transfer.
        for _ in range(1000):
            hc.allreduce_(x, op=op)
        caught[case] = "returned"
    except Exception as e:  # the agreement's timeout, on rank 0
        caught[case] = f"{type(e).__name__}: {e}"
    save(r, {"caught": caught})
    sys.stdout.flush()
    os._exit(0)
elif case == "gil":
    # While rank 1 waits inside a collective for rank 0 (which arrives 1.5 s late), a Python thread
    # on rank 1 keeps running: the core released the GIL.
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    if r == 0:
        time.sleep(1.5)
    t = threading.Thread(target=spin)
    t.start()
    hc.allreduce(torch.ones(4))
    stop.set()
    t.join()
    caught["ticks"] = str(ticks[0])
elif case == "optimizers_differ":
    # Rank 0's optimizer wrapper differs from the others': another op (OneBitAdam against Average), then another
    # option (freeze_step 10 against 20). The first step raises on every rank, naming what differs.
    def first_step(**options):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = hc.DistributedOptimizer(torch.optim.Adam(model.parameters()), named_parameters=model.named_parameters(),
                                      **options)
        x = torch.randn(8, 6)
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()

    attempt("op", lambda: first_step(**({"op": hc.OneBitAdam, "freeze_step": 10} if r == 0 else {"op": hc.Average})))
    attempt("freeze_step", lambda: first_step(op=hc.OneBitAdam, freeze_step=10 if r == 0 else 20))
elif case == "slow_peer":
    # Rank 0 alone is elsewhere (an evaluation, a checkpoint) for 3 s, longer than HVDC_STALL_WARNING (1 s) and far
    # shorter than HVDC_TIMEOUT: the others warn on stderr (fd 2, written by the core) naming the collective and
    # rank 0, then the collective completes. Each rank keeps what it wrote to fd 2 meanwhile.
    with tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            if r == 0:
                time.sleep(3.0)
            y = hc.allreduce(torch.full((2,), float(r + 1)), op=hc.Sum, name="Eval.metric")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        caught["stderr"] = err.read().decode(errors="replace")
    caught["slow_peer"] = str(y.tolist())
# After every error above, the ranks still agree and communicate.
z = hc.allreduce(torch.full((3,), float(r)), op=hc.Sum)
caught["recovered"] = str(z.tolist())
save(r, {"caught": caught})
