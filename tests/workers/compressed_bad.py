"""Bad input to hc.compressed_allreduce on some ranks only; every rank records what it raised and
whether its error buffers changed."""

import torch
from common import outcome, save

import hvd_compress.torch as hc
from hvd_compress.torch.onebit import OneBitState, compressed_allreduce

hc.init()
r, n = hc.rank(), hc.size()
caught: dict[str, str] = {}
unchanged: dict[str, bool] = {}

numel = 1000
state = OneBitState(numel)
# Some history, so that "unchanged" means something.
compressed_allreduce(torch.linspace(-1, 1, numel) * (r + 1), state, name="warm")


def attempt(label, fn, st=state):
    before = (st.worker_error.clone(), st.server_error.clone())
    caught[label] = outcome(fn)
    unchanged[label] = torch.equal(before[0], st.worker_error) and torch.equal(before[1], st.server_error)


x = torch.ones(numel)
bad_nan = x.clone()
if r == n - 1:
    bad_nan[5] = float("nan")
attempt("nan", lambda: compressed_allreduce(bad_nan, state))
bad_inf = x.clone().to(torch.float16)
if r == 0:
    bad_inf[999] = float("-inf")
attempt("inf_half", lambda: compressed_allreduce(bad_inf, state))

small = OneBitState(numel - 1) if r == 1 else state
attempt("worker_size", lambda: compressed_allreduce(x, small), st=state)
wrong_dtype = OneBitState(numel)
if r == 0:
    wrong_dtype.server_error = wrong_dtype.server_error.to(torch.float16)
attempt("server_dtype", lambda: compressed_allreduce(x, wrong_dtype), st=state)
attempt("float64", lambda: compressed_allreduce(x.double(), state))
mine = OneBitState(numel + r)
attempt("numel_mismatch", lambda: compressed_allreduce(torch.ones(numel + r), mine), st=mine)
# Overflow of the compensated value: finite input + finite error = inf.
huge = OneBitState(4)
huge.worker_error.fill_(3e38)
attempt("overflow", lambda: compressed_allreduce(torch.full((4,), 3e38), huge), st=huge)

# Still working afterwards, and the same as before on every rank.
y = compressed_allreduce(torch.full((numel,), float(r + 1)), OneBitState(numel), name="after")
caught["recovered"] = str(y[:3].tolist())
save(r, {"caught": caught, "unchanged": unchanged})
