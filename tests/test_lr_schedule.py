"""An LR schedule on the optimizer the user wrapped acts on every op's steps, as with Horovod's wrapper: a StepLR
made on the inner optimizer before wrapping (through ``hc.DistributedOptimizer`` and Horovod's routed entry, and
going on after the wrapper loads a state_dict or after ``hvd.broadcast_optimizer_state``), and one made on the
wrapper after, each step as the run whose rates are written by hand (``workers/lr_schedule.py``); Horovod's own
wrapper for Average and Sum; the inner optimizer's lr set to 0 after wrapping moves nothing, from the start or after
steps at its lr (whatever error feedback they left). 2 and 3 ranks, real
processes, numbers compared exactly."""

from __future__ import annotations

import pytest
import torch
from mpi_harness import Cases

#: Ops reduced as Horovod reduces them (its own wrapper runs them in the ``routed`` run): equal up to the order of
#: the sum, not bit for bit
HOROVODS = ("Average", "Sum")
#: What lr=0 may move, relative to the value: SLAMB's dense parameter average every sync_interval steps (two in the
#: run) rounds the float32 sum of n equal values (a unit in the last place each at 3 ranks, as Horovod's would)
ROUNDING = {"SLAMB": 2 * 2.0**-23}
RESUME_AT = 2  # workers/lr_schedule.py: the step of the resumed run's load and of the to_zero run's drop to lr 0
TINY = torch.finfo(torch.float32).tiny  # a zero element that stays zero moved by 0, not 0 / 0
CASE = ("4",)  # steps: past every op's warm-up (2 steps in the worker), SLAMB's two parameter averages


def _differ(a: list[torch.Tensor], b: list[torch.Tensor]) -> str | None:
    """Where the parameter sequences ``a`` and ``b`` first differ, or None."""
    for s, (x, y) in enumerate(zip(a, b, strict=True)):
        if not torch.equal(x, y):
            return f"step {s} by {float((x - y).abs().max())}"
    return None


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("lr_schedule.py", {2: [CASE], 3: [CASE]}, tmp_path_factory.mktemp("lr_schedule"), timeout_per_case=240)


@pytest.mark.parametrize("n", [2, 3])
def test_op_is_taken_by_the_names_its_error_lists_and_no_others(n: int, launched) -> None:
    # the by-hand runs of the schedule test name their op as a string; here what is refused, on every rank
    for r, got in enumerate(launched.ranks(n, CASE)):
        for op, refused in got["refused"].items():
            assert refused.startswith("ValueError") and "'OneBitAdam', " in refused and "'Max'" not in refused, \
                f"op={op} rank {r} of {n}: {refused}"


@pytest.mark.parametrize("n", [2, 3])
def test_lr_scheduler_on_the_wrapped_optimizer_acts_on_every_op(n: int, launched) -> None:
    for r, got in enumerate(launched.ranks(n, CASE)):
        for name, runs in got["ops"].items():
            where = f"op={name} rank {r} of {n}"
            want = runs["by_hand"]
            assert _differ(want, runs["constant"]), f"{where}: the scheduled rates changed nothing"
            for mode in ("before", "after", "routed", "resumed", "broadcast"):
                if mode not in runs:
                    continue
                if mode == "routed" and name in HOROVODS:
                    for s, (x, y) in enumerate(zip(runs[mode], want, strict=True)):
                        assert torch.allclose(x, y, rtol=1e-5, atol=1e-7), \
                            f"{where} step {s}: Horovod's wrapper under StepLR differs by {float((x - y).abs().max())}"
                    continue
                differ = _differ(runs[mode], want)
                assert differ is None, f"{where}: StepLR ({mode}) did not step as the scheduled rates: {differ}"
            x0 = runs["initial"]
            moved = [float(((p - x0).abs() / x0.abs()).max()) for p in runs["zero"]]
            assert max(moved) <= ROUNDING.get(name, 0.0), f"{where}: the inner lr=0 still moved it by {moved} (rel.)"
            # lr 0 after RESUME_AT steps at the op's lr: what the error feedback carries from then moves nothing
            later = runs["to_zero"]
            assert _differ(later[:RESUME_AT], runs["constant"][:RESUME_AT]) is None, f"{where}: to_zero's first steps"
            x0 = later[RESUME_AT - 1]
            moved = [float(((p - x0).abs() / x0.abs().clamp_min(TINY)).max()) for p in later[RESUME_AT:]]
            assert max(moved) <= ROUNDING.get(name, 0.0), \
                f"{where}: lr 0 after {RESUME_AT} steps still moved it by {moved} (rel.)"
