"""Process sets at n ranks: evens and odds (disjoint, their collectives run at once) and the first n-1 ranks.

``hc`` mode: hc.init(process_sets=[evens]) then hc.add_process_set for the others; ``hvd`` mode: Horovod makes
the sets (hvd.init(process_sets=...)) and hc takes Horovod's objects. Each rank saves its results and the
outcome of every error case; the test compares them with NumPy.
"""

import os
import sys

import torch
from common import outcome, rank_input, save

import hvd_compress.torch as hc

mode = sys.argv[2]
if mode == "hvd":
    import horovod.torch as hvd

    n, rank = int(os.environ["OMPI_COMM_WORLD_SIZE"]), int(os.environ["OMPI_COMM_WORLD_RANK"])
    evens, odds = hvd.ProcessSet(list(range(0, n, 2))), hvd.ProcessSet(list(range(1, n, 2)))
    first = hvd.ProcessSet(list(range(n - 1)))
    hvd.init(process_sets=[evens, odds, first])
else:
    from mpi4py import MPI

    n, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    evens = hc.ProcessSet(list(range(0, n, 2)))
    hc.init(process_sets=[evens])
    odds = hc.add_process_set(list(range(1, n, 2)))
    first = hc.add_process_set(hc.ProcessSet(list(range(n - 1))))

mine = evens if rank % 2 == 0 else odds
out = {"n": n, "mode": mode, "mine": list(mine.ranks)}
out["rank_size"] = (mine.rank(), mine.size(), mine.included(), first.included())

# Collectives on the two disjoint sets at once: each rank on its own set.
x = rank_input(rank, 1000, torch.float64, seed=1)
out["sum"] = hc.allreduce(x, op=hc.Sum, process_set=mine)
out["avg"] = hc.allreduce(x, op=hc.Average, name="avg", process_set=mine)
y = x.clone()
hc.allreduce_(y, op=hc.Max, process_set=mine)
out["max_"] = y
out["grouped"] = hc.grouped_allreduce([x[:10], x[10:30]], op=hc.Sum, process_set=mine)
out["gather"] = hc.allgather(torch.full((rank + 1, 2), float(rank)), process_set=mine)
root = mine.ranks[-1]  # a world rank
out["bcast"] = hc.broadcast(x, root_rank=root, process_set=mine)
z = x.clone()
hc.broadcast_(z, root_rank=root, process_set=mine)
out["bcast_"] = z
out["object"] = hc.broadcast_object({"from": rank}, root_rank=root, process_set=mine)
out["objects"] = hc.allgather_object(rank * 10, process_set=mine)
handle = hc.allreduce_async(x, op=hc.Sum, process_set=mine)
world = hc.allreduce(torch.ones(3), op=hc.Sum)  # the world's collective meanwhile
out["async"], out["world"] = hc.synchronize(handle), world
g = x[:5].clone().requires_grad_()
hc.allreduce(g, op=hc.Sum, process_set=mine).sum().backward()
out["grad"] = g.grad

# The first n-1 ranks: an overlapping set; the last rank is outside it.
if first.included():
    out["first_sum"] = hc.allreduce(x, op=hc.Sum, process_set=first)
out["outside"] = outcome(lambda: hc.allreduce(x, process_set=first))
out["outside_async"] = outcome(lambda: hc.allreduce_async(x, process_set=first))

# DistributedOptimizer over each rank's set (op=Average), and over `first`, whose last rank steps alone.
def train(ps, op):
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 2)
    opt = hc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=op,
                                  process_set=ps)
    hc.broadcast_parameters(model.state_dict(), root_rank=ps.ranks[0], process_set=ps) if ps.included() else None
    for step in range(3):
        gen = torch.Generator().manual_seed(10 * step + rank)
        data, target = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


out["opt_avg"] = train(mine, hc.Average)
out["opt_sum"] = train(mine, hc.Sum)
out["opt_first"] = train(first, hc.Average)
out["opt_adasum"] = outcome(lambda: hc.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(),
                                                                            lr=0.1), op=hc.Adasum, process_set=mine))
out["opt_onebit"] = outcome(lambda: hc.DistributedOptimizer(torch.optim.Adam(torch.nn.Linear(2, 1).parameters()),
                                                            op=hc.OneBitAdam, freeze_step=2, process_set=mine))

# Errors on every member (or every rank of the world for add_process_set).
me = mine.ranks.index(rank)
out["bad_shape"] = outcome(lambda: hc.allreduce(torch.ones(3 + me), process_set=mine))
out["bad_dtype"] = outcome(lambda: hc.allreduce(torch.ones(3, dtype=torch.bool if me == 0 else
                                                           torch.float32), process_set=mine))
outside_root = (mine.ranks[0] + 1) % n
out["bad_root"] = outcome(lambda: hc.broadcast(x, root_rank=outside_root, process_set=mine))
if mode == "hc":
    out["add_out_of_range"] = outcome(lambda: hc.add_process_set([0, n + 3]))
    out["add_one_rank_bad"] = outcome(lambda: hc.add_process_set([0, 1] if rank else [0, "1"]))
    out["add_differing"] = outcome(lambda: hc.add_process_set([0, 1] if rank else [0, 2]))
    out["add_duplicate"] = outcome(lambda: hc.add_process_set(list(range(1, n, 2))))
    out["add_all"] = hc.add_process_set(list(range(n))) is hc.global_process_set
    out["not_a_set"] = outcome(lambda: hc.allreduce(x, process_set=object()))
    out["removed"] = hc.remove_process_set(first)
    out["removed_use"] = outcome(lambda: hc.allreduce(x, process_set=first))
    out["removed_twice"] = hc.remove_process_set(first)
    out["remove_global"] = hc.remove_process_set(hc.global_process_set)
    out["after_errors"] = hc.allreduce(x, op=hc.Sum, process_set=mine)  # the set still works
out["stats"] = hc.comm_stats()
save(rank, out)
