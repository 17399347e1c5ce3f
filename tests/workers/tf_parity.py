"""The same parameters, gradients and hyper-parameters through the torch face and the Keras face, in one process
per rank (sharing hvd_compress's one runtime): saves both parameter traces. argv: out_dir, steps, freeze_step.
Cases marked "no decay": the first and last variables excluded from weight decay, in torch as a param group with
weight_decay 0 ahead of the others, in Keras with ``exclude_from_weight_decay``. Cases marked "reset": after step
RESET_AT torch loads its own ``state_dict()`` marked as another rank's, Keras calls ``reset_compression_state()``
(what a rank does with another rank's checkpoint); ``<case>/zeroed`` names the Keras state then all zero."""

import copy
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf
import torch
from tf_common import save

import hvd_compress.keras as hck
import hvd_compress.torch as hct

steps, freeze = int(sys.argv[2]), int(sys.argv[3])
hct.init()
r, n = hct.rank(), hct.size()
SIZES = [(13,), (5, 6), (7,)]
LR = float(np.float32(0.01))  # Keras keeps the learning rate in float32: torch gets the same value


def x0() -> list[np.ndarray]:
    rng = np.random.default_rng(777)
    return [rng.standard_normal(s).astype(np.float32) for s in SIZES]


def grads(t: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * t + r)
    return [rng.standard_normal(s).astype(np.float32) for s in SIZES]


NO_DECAY = (0, 2)  # the variables a "no decay" case excludes from weight decay (a bias, a LayerNorm scale)


RESET_AT = 3


def run_torch(make: str, op: object, options: dict, no_decay: bool = False) -> list[np.ndarray]:
    options = dict(options)
    reset = options.pop("reset", False)
    params = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in x0()]
    groups = params
    if no_decay:
        groups = [{"params": [params[i] for i in NO_DECAY], "weight_decay": 0.0},
                  {"params": [p for i, p in enumerate(params) if i not in NO_DECAY]}]
    inner = {
        "sgd": lambda: torch.optim.SGD(groups, lr=LR),
        "adamw": lambda: torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-7, weight_decay=0.004),
        "lamb": lambda: hct.Lamb(groups, lr=LR, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
        "birder": lambda: hct.Birder(groups, lr=LR, beta=0.9, eps=1e-8, weight_decay=0.01),
    }[make]()
    opt = hct.DistributedOptimizer(inner, named_parameters=[(f"p{i}", p) for i, p in enumerate(params)], op=op,
                                   **options)
    trace = []
    for t in range(steps):
        opt.zero_grad()
        for p, g in zip(params, grads(t), strict=True):
            p.grad = torch.from_numpy(g) if p.grad is None else p.grad.copy_(torch.from_numpy(g))
        opt.step()
        trace.append(np.concatenate([p.detach().numpy().ravel() for p in params]))
        if reset and t == RESET_AT:
            state = copy.deepcopy(opt.state_dict())
            state["hvd_compress"]["rank"] = (r + 1) % n
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.load_state_dict(state)
    return trace


def run_keras(make: str, op: object, options: dict, compiled: bool, no_decay: bool = False,
              zeroed: list | None = None) -> list[np.ndarray]:
    options = dict(options)
    reset = options.pop("reset", False)
    variables = [keras.Variable(a.copy(), name=f"p{i}") for i, a in enumerate(x0())]
    inner = {
        "sgd": lambda: keras.optimizers.SGD(LR),
        "adamw": lambda: keras.optimizers.AdamW(LR, beta_1=0.9, beta_2=0.999, epsilon=1e-7, weight_decay=0.004),
        "lamb": lambda: keras.optimizers.Lamb(LR, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.01),
        "birder": lambda: hck.Birder(LR, beta=0.9, epsilon=1e-8, weight_decay=0.01),
    }[make]()
    if no_decay:
        inner.exclude_from_weight_decay(var_list=[variables[i] for i in NO_DECAY])
    opt = hck.DistributedOptimizer(inner, op=hck.Birder if op is hct.Birder else op, **options)

    def step(gs: list[tf.Tensor]) -> None:
        opt.apply(gs, variables)

    fn = tf.function(step) if compiled else step
    trace = []
    for t in range(steps):
        fn([tf.constant(g) for g in grads(t)])
        trace.append(np.concatenate([v.numpy().ravel() for v in variables]))
        if reset and t == RESET_AT:
            opt.reset_compression_state()
            if zeroed is not None:
                zeroed += sorted(k for k, v in opt._hvdc.state.items() if v.shape.rank == 1 and not np.any(v.numpy()))
    return trace


CASES = {
    "Average/sgd": ("sgd", hct.Average, {}),
    "Sum/sgd": ("sgd", hct.Sum, {}),
    "Adasum/sgd": ("sgd", hct.Adasum, {}),
    "OneBitAdam/adamw": ("adamw", hct.OneBitAdam, {"freeze_step": freeze}),
    "OneBitLamb/lamb": ("lamb", hct.OneBitLamb, {"freeze_step": freeze}),
    # grad_size_thr=0: the (5, 6) layer goes through the masks; parameters averaged every 3 steps.
    "SLAMB/lamb": ("lamb", hct.SLAMB, {"compress_ratio": 0.5, "sync_interval": 3, "grad_size_thr": 0, "seed": 5}),
    "Birder/birder": ("birder", hct.Birder, {"seed": 3}),
    # Hierarchical (one node here: the node mean, then a 1-bit allreduce of the one leader with its error feedback).
    "OneBitAdam hierarchical/adamw": ("adamw", hct.OneBitAdam, {"freeze_step": freeze, "hierarchical": True}),
    "OneBitLamb hierarchical/lamb": ("lamb", hct.OneBitLamb, {"freeze_step": freeze, "hierarchical": True}),
    "Birder hierarchical/birder": ("birder", hct.Birder, {"seed": 3, "hierarchical": True}),
    "Average/birder": ("birder", hct.Average, {}),
    "OneBitAdam no decay/adamw": ("adamw", hct.OneBitAdam, {"freeze_step": freeze}),
    "OneBitLamb no decay/lamb": ("lamb", hct.OneBitLamb, {"freeze_step": freeze}),
    "SLAMB no decay/lamb": ("lamb", hct.SLAMB, {"compress_ratio": 0.5, "sync_interval": 3, "grad_size_thr": 0,
                                                "seed": 5}),
    "Birder no decay/birder": ("birder", hct.Birder, {"seed": 3}),
    "Birder reset/birder": ("birder", hct.Birder, {"seed": 3, "reset": True}),
    "Birder hierarchical reset/birder": ("birder", hct.Birder, {"seed": 3, "hierarchical": True, "reset": True}),
}
out = {}
for name, (make, op, options) in CASES.items():
    nd = "no decay" in name
    zeroed: list = []
    out[name] = {
        "torch": run_torch(make, op, options, nd),
        "keras": run_keras(make, op, options, compiled=True, no_decay=nd, zeroed=zeroed),
        "keras_eager": run_keras(make, op, options, compiled=False, no_decay=nd),
    }
    out[f"{name}/zeroed"] = zeroed
save(r, {"traces": out, "n": n})
