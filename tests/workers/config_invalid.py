"""hc.init() with the environment the test gives (a bad HVDC_* value): saves what each rank's init raised."""

import sys

from common import outcome, save
from mpi4py import MPI

import hvd_compress.torch as hc

rank = MPI.COMM_WORLD.Get_rank()
save(rank, {"init": outcome(hc.init)})
sys.exit(0)
