"""hc.DistributedOptimizer(op=ZeroOneAdam) on parameters whose gradients are given inputs: the loss
sum_i <P_i, G_i(step, rank)> makes every gradient exactly G_i, so the test feeds the same per-rank gradients to the
NumPy reference. Two param groups (two buckets, each with its own error feedback, u, x_anchor and lrs).

argv: out_dir mode steps sizes(comma list; the last one is group 2) options(k=v,...) [overlap(1|0)]
mode: "match" saves every step's parameters, hashes, kinds, lrs and bytes; "match+bad" also runs
zero_one_adam_bad.py's checks.
``stops=a:b:...`` among the options: the run saves a checkpoint before each of those steps and restarts from each
(fresh objects, torch.load), saving the resumed runs' hashes and final state. Each run's warnings about inflated
steps after the freeze are saved as "warned". ``lrs=a:b:...``: one more run from the start with those learning
rates, one per step, set in every param group before the step (an lr schedule; spec Z21), its parameters saved
as "scheduled". ``trains=N``: a small ReLU MLP trained N steps by op=ZeroOneAdam with its default options and
var_freeze_step 3 around Adam(lr=3e-3), full-data loss after each step (or the error it raised) as "trains".
"""

import hashlib
import io
import sys
import warnings

import torch
from common import rank_input, save

import hvd_compress.torch as hc

mode, steps = sys.argv[2], int(sys.argv[3])
sizes = [int(s) for s in sys.argv[4].split(",")]
options = dict(kv.split("=") for kv in sys.argv[5].split(",") if kv)
stops = [int(s) for s in options.pop("stops", "").split(":") if s]
schedule = [float(s) for s in options.pop("lrs", "").split(":") if s]
train_steps = int(options.pop("trains", "0"))
BOOLS = ("variance_bias_correction", "reset_momentum_at_sync")
options = {k: v == "1" if k in BOOLS else int(v) for k, v in options.items()}
overlap = sys.argv[6] != "0" if len(sys.argv) > 6 else True
hc.init()
r = hc.rank()
torch.set_num_threads(1)
total = sum(sizes)


def make() -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    x0 = rank_input(0, total, torch.float32, seed=777)  # the same on every rank
    params = [torch.nn.Parameter(p.clone()) for p in x0.split(sizes)]
    base = torch.optim.AdamW([{"params": params[:-1]}, {"params": params[-1:]}], lr=0.01, weight_decay=0.05)
    opt = hc.DistributedOptimizer(base, named_parameters=[(f"p{i}", p) for i, p in enumerate(params)],
                                  op=hc.ZeroOneAdam, overlap=overlap, **options)
    return params, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)


def flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def run(params, opt, sched, first: int, out: dict, checkpoints: dict | None = None) -> None:
    """Steps ``first`` to the end into ``out``, with the inflated-step warnings (spec Z19) the run gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps_from(params, opt, sched, first, out, checkpoints)
    out["warned"] = [str(w.message) for w in caught if "variance updates" in str(w.message)]


def steps_from(params, opt, sched, first: int, out: dict, checkpoints: dict | None) -> None:
    for step in range(first, steps):
        if checkpoints is not None and step in stops:
            buf = io.BytesIO()
            torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict(),
                        "sched": sched.state_dict()}, buf)
            checkpoints[step] = buf.getvalue()
        opt.zero_grad()
        out["kinds"].append(opt.step_kind)
        grads = rank_input(r, total, torch.float32, seed=step + 1).split(sizes)
        sum((p * g).sum() for p, g in zip(params, grads, strict=True)).backward()
        out["lrs"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        out["trace"].append(flat(params).clone())
        out["hashes"].append(digest(flat(params)))
        out["stats"].append(opt.comm_stats())


def state_digest(opt) -> str:
    ours = opt.state_dict()["hvd_compress"]
    parts = [t for seg in ours["buckets"] for t in (seg["u"], seg["anchor"], seg["onebit"]["worker_error"],
                                                     seg["onebit"]["server_error"])]
    m = [s["exp_avg"].reshape(-1) for s in opt.state_dict()["state"].values()]
    return digest(torch.cat([t.reshape(-1) for t in parts + m])) + repr([s["lrs"] for s in ours["buckets"]])


params, opt, sched = make()
a = {"kinds": [], "lrs": [], "trace": [], "hashes": [], "stats": []}
checkpoints: dict[int, bytes] = {}
run(params, opt, sched, 0, a, checkpoints)
result = {**a, "state": opt.state_dict(), "final_state": state_digest(opt), "resumed": {}}
for stop, blob in checkpoints.items():
    params, opt, sched = make()
    saved = torch.load(io.BytesIO(blob), weights_only=False)
    with torch.no_grad():
        for p, v in zip(params, saved["params"], strict=True):
            p.copy_(v)
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    b = {"kinds": [], "lrs": [], "trace": [], "hashes": [], "stats": []}
    run(params, opt, sched, stop, b)
    result["resumed"][stop] = {"hashes": b["hashes"], "kinds": b["kinds"], "final_state": state_digest(opt),
                               "warned": b["warned"]}
if schedule:
    params, opt, _ = make()
    result["scheduled"] = []
    for step, lr in enumerate(schedule):
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        grads = rank_input(r, total, torch.float32, seed=step + 1).split(sizes)
        sum((p * g).sum() for p, g in zip(params, grads, strict=True)).backward()
        opt.step()
        result["scheduled"].append(flat(params).clone())
# Each op around an inner optimizer of another kind than the one it wraps: what the constructor says (item 10).
net = torch.nn.Linear(4, 2)
INNER = {"Adam": torch.optim.Adam, "Lamb": hc.Lamb, "Birder": hc.Birder, "SGD": torch.optim.SGD}
MISMATCHED = {"OneBitAdam": ("Lamb", "Birder"), "ZeroOneAdam": ("Lamb", "Birder"), "OneBitLamb": ("Adam", "Birder"),
              "SLAMB": ("Adam", "Birder"), "Birder": ("Adam", "Lamb"), "SignSGD": ("Adam",)}
result["inner_mismatch"] = {}
for op, names in MISMATCHED.items():
    for name in names:
        try:
            hc.DistributedOptimizer(INNER[name](net.parameters(), lr=0.01), net.named_parameters(), op=getattr(hc, op),
                                    **({"freeze_step": 2} if op.startswith("OneBit") else {}))
            said = "no error"
        except Exception as e:
            said = f"{type(e).__name__}: {e}"
        result["inner_mismatch"][(op, name)] = said
if train_steps:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 4))
    data = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 4, generator=data)
    xs = torch.rand(512, 32, generator=data)
    ys = ((xs - 0.5) @ teacher).argmax(1)
    opt = hc.DistributedOptimizer(torch.optim.Adam(mlp.parameters(), lr=3e-3), mlp.named_parameters(),
                                  op=hc.ZeroOneAdam, var_freeze_step=3)
    order = torch.Generator().manual_seed(100 + r)
    result["trains"] = {"losses": [], "error": None}
    try:
        for _ in range(train_steps):
            batch = torch.randint(512, (32,), generator=order)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(mlp(xs[batch]), ys[batch]).backward()
            opt.step()
            with torch.no_grad():
                result["trains"]["losses"].append(torch.nn.functional.cross_entropy(mlp(xs), ys).item())
    except hc.UsageError as e:
        result["trains"]["error"] = str(e)
if mode == "match+bad":
    from zero_one_adam_bad import bad_cases

    result["bad"] = bad_cases(r, hc.size())
save(r, result)
