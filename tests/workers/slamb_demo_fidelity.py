"""The teacher task (teacher_task.py: a ReLU MLP on a noisy teacher regression) trained with hc.Lamb (dense
average) and with SLAMB (k = 0.1, H = 100) through its own ``train`` (or with its reductions named in argv, e.g.
BirderDense,Birder,Adam for tests/test_birder_fidelity.py); saves each run's final held-out loss and bytes.

argv: out_dir epochs shard [comma-separated reductions of teacher_task.py, default Lamb,SLAMB]
"""

import sys

import teacher_task
import torch
from common import save

import hvd_compress.torch as hc

epochs, shard = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
hc.init()
names = sys.argv[4].split(",") if len(sys.argv) > 4 else ["Lamb", "SLAMB"]
save(hc.rank(), {name: teacher_task.train(name, epochs, 32, shard) for name in names})
