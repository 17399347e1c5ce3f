"""1-bit Adam / 1-bit LAMB against dense Adam / hc.Lamb on ReLU networks, where dead units leave
elements whose frozen variance is exactly 0 (issue "Algorithms written once", item 6).

Two tasks, each rank training on its own shard and every rank scoring the same held-out set:

- ``mlp``: a 4-layer ReLU MLP (256 inputs, width 256, 8 outputs) on a synthetic 8-class task: inputs
  uniform in [0, 1]^256 (non-negative, like pixel intensities: units whose weights sum to a negative
  value are dead on every input), labels the argmax of a fixed random ReLU teacher's logits;
  cross-entropy on 4096 held-out samples.
- ``cnn``: a small ReLU CNN on scikit-learn's bundled digits (8x8 images, 10 classes), 1297 training
  images sharded over the ranks, 500 held out.

argv: out_dir task(mlp|cnn) steps runs
  runs: comma list of Adam, Lamb (dense average), OneBitAdam:<variance_floor>:<freeze_step> and
  OneBitLamb:<variance_floor>:<freeze_step> (variance_floor 0: the papers' exact rule),
  SLAMB:<compress_ratio>:<sync_interval>, ZeroOneAdam:<var_freeze_step>:<var_update_scaler>:<local_step_scaler>:
  <local_step_clipper>[:<variance_floor>[:<bucket_mb>[:<variance_bias_correction 0|1>]]] (op=hc.ZeroOneAdam over
  the same Adam), Birder[:<seed>]
  (op=hc.Birder), BirderHier (hierarchical=True), BirderDense (hc.Birder behind op=hc.Average) and BirderExact
  (Alg. 1 with its quantization left out: ``ExactMeanBirder``), run one after another from the same initial model
  and data order. MODEL_SEED in the environment: the model's seed (default 1).

Saves per rank, for each run: the final held-out loss (NaN if the run raised or diverged), the error it
raised if any, the largest |parameter| right after the first compressed step and at the end, the SHA-256
of the final parameters, the bytes this rank sent, and the kind of 0/1 Adam's last step.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time

import torch
from common import digits_images, save

import hvd_compress.torch as hc

task, steps, runs = sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
BATCH = 16  # per rank
LR = {"Adam": 1e-3, "Lamb": 1e-2, "Birder": float(os.environ.get("BIRDER_LR", "1e-3"))}

hc.init()
torch.set_num_threads(1)
rank, size = hc.rank(), hc.size()


def mlp_task() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    w1, b1 = torch.randn(256, 64, generator=g) / 8, torch.randn(64, generator=g) * 0.5
    w2 = torch.randn(64, 8, generator=g) / 4

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, 256, generator=g)
        # The teacher sees centred inputs so that every class occurs.
        return x, (torch.relu((x - 0.5) @ w1 + b1) @ w2).argmax(dim=1)

    x_test, y_test = sample(4096)
    x, y = sample(2048 * size)
    return x[rank::size], y[rank::size], x_test, y_test


def make_model() -> torch.nn.Module:
    torch.manual_seed(int(os.environ.get("MODEL_SEED", "1")))  # the tests' seed 1; others to measure a spread
    relu = torch.nn.ReLU
    if task == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(256, 256), relu(), torch.nn.Linear(256, 256), relu(),
                                   torch.nn.Linear(256, 256), relu(), torch.nn.Linear(256, 8))
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), relu(), torch.nn.Conv2d(16, 32, 3, padding=1),
                               relu(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64),
                               relu(), torch.nn.Linear(64, 10))


class ExactMeanBirder(hc.Birder):
    """Paper 004's Alg. 1 without its quantization: x -= lr * mean over ranks of m_i / (b_i + eps), each rank's m_i
    and b_i from its own gradient (lines 5-6). Each rank steps ``hc.Birder``'s own rule on its own gradient, then
    the parameters are averaged exactly (float32 allreduce): every rank held the same x before the step, so the
    mean of x - lr r_i is x - lr mean(r_i) up to rounding. What op=hc.Birder would give with lossless
    communication: Birder's distance from this run is the compression's own cost, where its distance from
    hc.Birder behind op=hc.Average also holds the rule's (ratios per worker, not of the averaged gradient)."""

    @torch.no_grad()
    def step(self, closure=None) -> None:
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                hc.allreduce_(p, op=hc.Average, name="relu_fidelity.exact_birder")


def make_optimizer(run: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    name, floor, freeze = [*run.split(":"), "", ""][:3]
    if name == "BirderExact":
        return ExactMeanBirder(model.parameters(), lr=LR["Birder"])
    if name.startswith("Birder"):  # Birder (paper 004): BirderDense = hc.Birder's rule behind a dense average
        base = hc.Birder(model.parameters(), lr=LR["Birder"])
        hier = name == "BirderHier"
        options = {"op": hc.Average} if name == "BirderDense" else {
            "op": hc.Birder, "hierarchical": hier, "seed": int(floor or 0)}
        return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)
    if name.endswith("Adam"):
        base = torch.optim.Adam(model.parameters(), lr=LR["Adam"])
    else:
        base = hc.Lamb(model.parameters(), lr=LR["Lamb"])
    options = {"op": hc.Average} if not name.startswith("OneBit") else {
        "op": getattr(hc, name), "freeze_step": int(freeze), "variance_floor": float(floor)}
    if name == "ZeroOneAdam":  # in ZeroOneAdamOptions' order; the variance floor optional
        keys = ("var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper", "variance_floor",
                "bucket_mb", "variance_bias_correction")
        options = {"op": hc.ZeroOneAdam, **{k: int(v) if i < 4 else float(v) if i < 6 else v == "1"
                                            for i, (k, v) in enumerate(zip(keys, run.split(":")[1:], strict=False))}}
    if name == "SLAMB":  # SLAMB:<compress_ratio>:<sync_interval>
        options = {"op": hc.SLAMB, "compress_ratio": float(floor), "sync_interval": int(freeze), "seed": 5}
    return hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), **options)


def train(run: str, data: tuple[torch.Tensor, ...]) -> dict[str, object]:
    x, y, x_test, y_test = data
    at = {"OneBit": 2, "ZeroOneAdam": 1}  # where a run names its last warm-up step
    freeze = next((int(run.split(":")[i]) for k, i in at.items() if run.startswith(k)), 0)
    model = make_model()
    hc.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_optimizer(run, model)
    # Cosine decay to 0: the final loss is that of a settled model, not of one noisy step.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    order = torch.Generator().manual_seed(100 + rank)
    out: dict[str, object] = {"error": None, "max_abs_after_freeze": math.nan}
    step = 0
    start = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            idx = torch.randint(len(y), (BATCH,), generator=order)
            kind = getattr(opt, "step_kind", None)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
            out["last_kind"] = kind
            if step == freeze + 1:
                out["max_abs_after_freeze"] = max(float(p.detach().abs().max()) for p in model.parameters())
    except hc.UsageError as e:  # non-finite values reached the optimizer: the run failed
        out["error"] = f"step {step}: {e}"
    if hasattr(opt, "synchronize_parameters") and out["error"] is None:
        opt.synchronize_parameters()  # SLAMB: the ranks' models differ between syncs; evaluate their average
    with torch.no_grad():
        test = torch.nn.functional.cross_entropy(model(x_test), y_test).item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out["test_loss"] = test if out["error"] is None and math.isfinite(test) else math.nan
    out["hash"] = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    out["max_abs_final"] = float(flat.abs().max())
    out["seconds"] = time.perf_counter() - start
    out["bytes_sent"] = opt.comm_stats()["bytes_sent"] if hasattr(opt, "comm_stats") else 0
    if rank == 0:
        print(f"{task} {run:>26}: held-out loss {test:.4f}  max|x| after freeze "
              f"{out['max_abs_after_freeze']:.3g}  {out['bytes_sent'] / 1e6:.2f} MB sent  {out['seconds']:.1f} s  "
              f"{out['error'] or ''}", flush=True)
    return out


data = mlp_task() if task == "mlp" else digits_images(rank, size)
save(rank, {run: train(run, data) for run in runs})
