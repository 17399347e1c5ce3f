"""Resume the Horovod way (Horovod's docs): rank 0 loads the checkpoint, then hvd.broadcast_parameters and
hvd.broadcast_optimizer_state give every rank its model and optimizer state; or every rank loads rank 0's file.

argv: out_dir [save|load]. ``save`` (at 2 ranks) writes rank 0's plain and gathered checkpoints of ``WORLD_OPS`` into
out_dir, and ``load`` (at another rank count) resumes them the Horovod way: per op and kind ``<op> <kind> world``
the outcome, ``... warnings`` the warnings and ``... hashes`` the parameters' hashes of the steps after.

Without them: saves per rank, per op, the parameters' hashes of the steps after the resume, by mode: ``gathered``
(rank 0 saved hc.full_optimizer_state_dict, every rank having called it; rank 0 loads it, then Horovod's
broadcasts), ``gathered_file`` (every rank loads that one file), ``hvd``
(Horovod's broadcasts, the optimizer's routed to hc's), ``hc`` (hc.broadcast_parameters and
hc.broadcast_optimizer_state), ``file`` (every rank loads rank 0's
file), ``reference`` (every rank loads rank 0's file with the error feedback zeroed on the other ranks and marked as
its own, so that nothing of the wrapper's acts on it), ``root_errors`` (rank 0's file marked as each rank's own:
rank 0's error feedback on every rank), ``full`` (the run never stopped) and ``midway`` (the run never stopped, with
hc.broadcast_optimizer_state from rank 0 after SAVED_AT steps); ``<op> hvd`` the outcome of the Horovod resume and
``<op> warnings <mode>`` the warnings the ``file`` load and the two broadcasts gave. ``hvd`` and ``hc`` start from
hc's runtime shut down, as in a new launch; a rank stuck there for RECIPE_TIMEOUT_S exits with its stacks.
"""

import copy
import faulthandler
import hashlib
import io
import sys
import warnings

import horovod.torch as hvd
import torch
from common import outcome, save

import hvd_compress.torch as hc
from hvd_compress.ops import runtime

hvd.init()
torch.set_num_threads(1)
r = hvd.rank()
STEPS, SAVED_AT = 7, 4
RECIPE_TIMEOUT_S = 60  # the Horovod recipe and the steps after it take seconds
#: Where the checkpoint is taken where not at SAVED_AT: at a sync, where the ranks' parameters are alike (0/1 Adam's
#: local steps leave them apart between syncs, and rank 0's model is the one saved)
SAVED_AT_OF = {"ZeroOneAdam": 5}


def saved_at(name: str) -> int:
    return SAVED_AT_OF.get(name, SAVED_AT)


def adam(ps):
    return torch.optim.Adam(ps, lr=0.01)


OPS = {  # every op past its warm-up at SAVED_AT, so that its error feedback is not zero
    "OneBitAdam": (adam, {"freeze_step": 2}),
    "OneBitLamb": (lambda ps: hc.Lamb(ps, lr=0.01), {"freeze_step": 2}),
    "ZeroOneAdam": (adam, {"var_freeze_step": 2, "local_step_scaler": 1, "local_step_clipper": 2,
                           "variance_bias_correction": True}),
    "Birder": (lambda ps: hc.Birder(ps, lr=0.001), {}),
    "BirderHierarchical": (lambda ps: hc.Birder(ps, lr=0.001), {"hierarchical": True}),
    "SignSGD": (lambda ps: torch.optim.SGD(ps, lr=0.01), {}),
    "PowerSGD": (adam, {"matrix_approximation_rank": 1, "start_powerSGD_iter": 1}),
    "TopK": (lambda ps: torch.optim.SGD(ps, lr=0.01),
             {"compression": hc.Compression.topk(0.25, momentum=0.9), "overlap": False}),
    "SLAMB": (lambda ps: hc.Lamb(ps, lr=0.01), {"compress_ratio": 0.5, "sync_interval": 2}),
    "Adasum": (adam, {}),
    "Average": (adam, {}),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def make(name: str, m: torch.nn.Module) -> torch.optim.Optimizer:
    inner, options = OPS[name]
    op = "Birder" if name.startswith("Birder") else name
    if name == "TopK":  # hvd.DistributedOptimizer(op=Average) is Horovod's own, which has no top-k
        return hc.DistributedOptimizer(inner(m.parameters()), named_parameters=m.named_parameters(), **options)
    return hvd.DistributedOptimizer(inner(m.parameters()), named_parameters=m.named_parameters(),
                                    op=getattr(hc, op), **options)


def step(m: torch.nn.Module, opt: torch.optim.Optimizer, s: int) -> str:
    g = torch.Generator().manual_seed(100 * s + r)
    x = torch.randn(8, 6, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def checkpoint(name: str, gathered: bool = False) -> bytes:
    """Rank 0's checkpoint after SAVED_AT steps, on every rank (the other ranks' own is never read); ``gathered``:
    of hc.full_optimizer_state_dict, which every rank calls."""
    m = model()
    opt = make(name, m)
    for s in range(saved_at(name)):
        step(m, opt, s)
    state = hc.full_optimizer_state_dict(opt) if gathered else None
    buf = io.BytesIO()
    if r == 0:
        torch.save({"model": m.state_dict(), "optimizer": state if gathered else opt.state_dict()}, buf)
    return hc.broadcast_object(buf.getvalue(), 0)


def as_own(state: dict, zero_errors: bool, moments: bool) -> dict:
    """``state`` marked as this rank's; with ``zero_errors`` every tensor under a key naming an error zeroed, and
    with ``moments`` too Birder's m and b (this rank's chunk's with more than one rank per node)."""
    state = copy.deepcopy(state)
    section = state.get("hvd_compress")
    if section is None:
        return state
    section["rank"] = r

    def walk(node, under_error: bool) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            here = under_error or "error" in str(key) or key == "velocity" or (moments and key in ("m", "b"))
            if isinstance(value, torch.Tensor) and here:
                value.zero_()
            else:
                walk(value, here)

    if zero_errors:
        walk(section, False)
    return state


def resume(name: str, saved: bytes, mode: str, seen: list) -> list[str]:
    if mode in ("hvd", "hc"):
        # The recipe as a new launch runs it: hc's runtime not yet started when the wrapper is built (a local call
        # that started it, such as rank 0's load_state_dict, would wait for the others forever: they wait in
        # Horovod's broadcast). The watchdog turns such a hang into this rank's failure, with every thread's stack.
        runtime.shutdown()
        faulthandler.dump_traceback_later(RECIPE_TIMEOUT_S, exit=True)
    try:
        return resumed(name, saved, mode, seen)
    finally:
        faulthandler.cancel_dump_traceback_later()


def resumed(name: str, saved: bytes, mode: str, seen: list) -> list[str]:
    m = model()
    opt = make(name, m)
    ckpt = torch.load(io.BytesIO(saved), weights_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode in ("full", "midway"):
            for s in range(saved_at(name)):
                step(m, opt, s)
            if mode == "midway":
                hc.broadcast_optimizer_state(opt, root_rank=0)
        elif mode in ("hvd", "hc", "gathered"):
            if r == 0:
                m.load_state_dict(ckpt["model"])
                opt.load_state_dict(ckpt["optimizer"])
            (hc if mode == "hc" else hvd).broadcast_parameters(m.state_dict(), root_rank=0)
            (hc if mode == "hc" else hvd).broadcast_optimizer_state(opt, root_rank=0)
        else:
            m.load_state_dict(ckpt["model"])
            state = ckpt["optimizer"]
            if mode in ("reference", "root_errors"):
                state = as_own(state, zero_errors=mode == "reference" and r != 0,
                               moments=name == "BirderHierarchical")
            opt.load_state_dict(state)
    seen += [str(w.message) for w in caught if issubclass(w.category, hc.PerRankStateWarning)]
    return [step(m, opt, s) for s in range(saved_at(name), saved_at(name) + STEPS - SAVED_AT)]


#: Ops resumed at another world size: one whose state depends on it (refused on every rank), ones whose per-rank
#: state alone does (reset, with a warning on every rank)
WORLD_OPS = ("OneBitAdam", "ZeroOneAdam", "Adasum", "PowerSGD")


def other_world(name: str, kind: str, out: dict) -> None:
    """Resume ``name``'s checkpoint of ``kind`` (plain or gathered) written at 2 ranks, the Horovod way."""
    with open(f"{sys.argv[1]}/{name}.{kind}.pt", "rb") as f:
        saved = f.read()
    seen: list[str] = []
    key = f"{name} {kind} world"
    out[key] = outcome(lambda: out.setdefault(f"{key} hashes", resume(name, saved, "hvd", seen)))
    out[f"{key} warnings"] = seen


out = {}
if sys.argv[2:] == ["save"]:
    for name in WORLD_OPS:
        for kind in ("plain", "gathered"):
            saved = checkpoint(name, gathered=kind == "gathered")
            if r == 0:
                with open(f"{sys.argv[1]}/{name}.{kind}.pt", "wb") as f:
                    f.write(saved)
elif sys.argv[2:] == ["load"]:
    for name in WORLD_OPS:
        for kind in ("plain", "gathered"):
            other_world(name, kind, out)
else:
    MODES = ("hc", "file", "reference", "root_errors", "full", "midway", "gathered", "gathered_file")
    for name in OPS:
        saved, gathered = checkpoint(name), checkpoint(name, gathered=True)
        seen: dict[str, list[str]] = {mode: [] for mode in ("hvd", *MODES)}
        out[f"{name} hvd"] = outcome(lambda name=name, saved=saved, seen=seen: out.setdefault(
            name, resume(name, saved, "hvd", seen["hvd"])))
        for mode in MODES:
            out[f"{name} {mode}"] = resume(name, gathered if mode.startswith("gathered") else saved,
                                           "file" if mode == "gathered_file" else mode, seen[mode])
        for mode, got in seen.items():
            out[f"{name} warnings {mode}"] = got
    saved = checkpoint("OneBitAdam")
    with warnings.catch_warnings(record=True) as caught:  # the filters as they are: every load says so
        for _ in range(2):
            make("OneBitAdam", model()).load_state_dict(torch.load(io.BytesIO(saved), weights_only=False)["optimizer"])
    out["warned per load"] = sum("starts its error feedback from zero" in str(w.message) for w in caught)
save(r, out)
