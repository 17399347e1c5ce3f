"""examples/demo.py's task (a ReLU MLP on a noisy teacher regression) trained with hc.Lamb (dense average) and
with SLAMB (k = 0.1, H = 100) through the demo's own ``train``; saves each run's final held-out loss and bytes.

argv: out_dir epochs shard
"""

import sys
from pathlib import Path

import torch
from common import save

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import demo

import hvd_compress.torch as hc

epochs, shard = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
hc.init()
save(hc.rank(), {name: demo.train(name, epochs, 32, shard) for name in ("Lamb", "SLAMB")})
