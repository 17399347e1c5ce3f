"""A training script in which the last rank stops early and exits normally while the others go on training: its
script ends (argv[2] "return") or it calls sys.exit(0) ("sys.exit"). argv[3]: "keras" (model.fit with fewer
batches on the last rank) or the torch op (Average, OneBitAdam, Adasum) of a Horovod-style loop. The survivors must
raise an hvd_compress error naming that rank and the collective they waited in, within seconds; each rank prints
when it finished or raised, for the test to time, and in torch what a collective after that raised."""

import sys
import time

how, face = sys.argv[2], sys.argv[3]
if face == "keras":
    import horovod.tensorflow.keras as hvd
    import keras
    import numpy as np

    import hvd_compress.keras as hck
else:
    import horovod.torch as hvd
    import torch

    import hvd_compress.torch as hc

hvd.init()
r, n = hvd.rank(), hvd.size()
steps = 3 if r == n - 1 else 6


def train_torch(op: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.05) if op == "Average" else torch.optim.Adam(model.parameters())
    # hc's ops through Horovod's entry point; op=Average through hc's (Horovod's entry keeps its own Average)
    wrap = hc.DistributedOptimizer if op == "Average" else hvd.DistributedOptimizer
    opt = wrap(inner, named_parameters=model.named_parameters(), op=getattr(hc, op),
               **({"freeze_step": 2} if op == "OneBitAdam" else {}))
    for _ in range(steps):
        x = torch.randn(8, 6)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()


def train_keras() -> None:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hck.DistributedOptimizer(keras.optimizers.Adam(0.01), op=hck.OneBitAdam, freeze_step=2),
                  loss="mse", jit_compile=False)
    x = np.random.default_rng(r).standard_normal((8 * steps, 6)).astype("float32")
    model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1, verbose=0)


try:
    train_keras() if face == "keras" else train_torch(face)
except Exception as e:
    print(f"rank {r} raised {type(e).__name__} at {time.time():.3f}", flush=True)
    if face != "keras":  # a later collective names that first failure
        try:
            hc.allreduce(torch.ones(2), op=hc.Sum)
        except Exception as later:
            print(f"rank {r} then raised {type(later).__name__}: {later}", flush=True)
    raise
print(f"rank {r} finished its {steps} steps at {time.time():.3f}", flush=True)
if how == "sys.exit":
    sys.exit(0)
