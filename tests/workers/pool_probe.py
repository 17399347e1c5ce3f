"""What a pooled job finds when it starts (``tests/test_mpi_pool.py``); then it leaves state behind (an environment
variable, the runtime, Horovod's entry points switched back to Horovod's own), raises or hangs as the second argument
says."""

import json
import os
import sys
import time

from hvd_compress.ops import horovod_entry, runtime

mode = sys.argv[2]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
found = {"pid": os.getpid(), "initialized": runtime.is_initialized(), "probe": os.environ.get("PROBE"),
         "left": os.environ.get("LEFT"), "routing": horovod_entry._enabled()}
runtime.init()
os.environ["LEFT"] = "by an earlier job"
horovod_entry.horovod_entry(False)  # Horovod's own entry points from here on, in this process
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(found, f)
op = "OneBitAdam"  # as a worker's loop names its op and step: the test side's failure line names both
for step in range(3):
    if mode == "raise" and rank == 1 and step == 2:
        raise RuntimeError("pool_probe: rank 1 raised")
if mode == "hang" and rank == 0:
    time.sleep(60)
