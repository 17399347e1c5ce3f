"""A GAN's loop with two wrapped optimizers: the generator's backward also fills the discriminator's gradients
(under overlap their buckets are even reduced), and the discriminator's next ``zero_grad()`` drops them. That pass
must not count towards ``backward_passes_per_step`` (Horovod's wrapper raises at that ``zero_grad()``): the loop
trains, the ranks agree, and op=Average equals Adam on the exact average of the ranks' gradients. 2 and 3 ranks."""

from __future__ import annotations

import pytest
from mpi_harness import assert_alike_and_near, load_ranks, mpirun

CASES = ["Average", "Average:nooverlap", "PowerSGD", "OneBitAdam"]


@pytest.mark.parametrize("n", [2, 3])
def test_gan_loop_with_two_wrapped_optimizers_trains_alike_on_every_rank(n: int, out_dir) -> None:
    mpirun("gan_step.py", n, out_dir, ",".join(CASES), timeout=180)
    ranks = load_ranks(out_dir, n)
    want = ranks[0]["reference"]
    for case in CASES:
        got = [rk[case] for rk in ranks]
        assert all(isinstance(g, dict) for g in got), f"{case} at {n} ranks: {got}"
        # op=Average against Adam on the exact average of the ranks' gradients
        assert_alike_and_near(got, ("g", "d"), f"{case} n={n}", want if case.startswith("Average") else None, 1e-5)
