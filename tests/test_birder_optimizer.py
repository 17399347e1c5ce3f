"""hc.Birder (the uncompressed rule) and hc.DistributedOptimizer(op=hc.Birder) on real MPI processes
(paper 004 Alg. 1; specs/birder.md): identical parameters on every rank after every step, exact resume,
bad input raising on every rank with the state untouched, bytes per step; 1-bit Adam with hierarchical=True."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from mpi_harness import USAGE, Cases, load_ranks, mpirun

import hvd_compress.torch as hc
from hvd_compress.reference import birder as ref


def test_uncompressed_rule_matches_numpy() -> None:
    """m, b moving averages of g and |g|, x -= lr m / (b + eps) + lr wd x (spec 3, B3, B4), 3 steps."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50))
    opt = hc.Birder([p], lr=0.1, beta=0.9, eps=1e-8, weight_decay=0.01)
    x, m, b = p.detach().double().numpy().copy(), np.zeros(50), np.zeros(50)
    for _ in range(3):
        g = torch.randn(50)
        p.grad = g.clone()
        opt.step()
        gd = g.double().numpy()
        m = 0.9 * m + 0.1 * gd
        b = 0.9 * b + 0.1 * np.abs(gd)
        x = x - 0.1 * m / (b + 1e-8) - 0.1 * 0.01 * x
    np.testing.assert_allclose(p.detach().double().numpy(), x, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="beta"):
        hc.Birder([p], beta=1.0)


@pytest.mark.parametrize(("world", "local"), [(2, 0), (3, 0), (4, 2)], ids=["n2", "n3", "2x2"])
def test_birder_optimizer_on_every_rank(world: int, local: int, out_dir) -> None:
    env = {"HVDC_LOCAL_SIZE": str(local)} if local else None
    mpirun("birder_optimizer.py", world, out_dir, "1" if local else "0", env=env, timeout=240)
    ranks = load_ranks(out_dir, world)
    where = f"world {world}, local size {local}"
    for r in range(world):
        for t, (got, want) in enumerate(zip(ranks[r]["params"], ranks[0]["params"], strict=True)):
            assert torch.equal(got, want), f"{where}: rank {r} parameters differ from rank 0's after step {t + 1}"
        for t, (got, want) in enumerate(zip(ranks[r]["resumed"], ranks[r]["params"][3:], strict=True)):
            assert torch.equal(got, want), f"{where}: rank {r} resumed run differs at step {t + 4}: " \
                f"max {float((got - want).abs().max()):.3g}"
        nan = ranks[r]["nan"]
        assert any(k in nan for k in USAGE) and "non-finite" in nan, f"rank {r}: {nan}"
        assert ranks[r]["nan_state_unchanged"] and ranks[r]["nan_step_unchanged"], f"rank {r}: state changed on NaN"
        assert "ValueError" in ranks[r]["other_algorithm"] and "OneBitAdam" in ranks[r]["other_algorithm"]
        assert "ValueError" in ranks[r]["other_world"] and "world_size" in ranks[r]["other_world"]
        assert ranks[r]["state_after_refusals"], f"rank {r}: a refused checkpoint changed the state"
        for t, (got, want) in enumerate(zip(ranks[r]["onebit_params"], ranks[0]["onebit_params"], strict=True)):
            assert torch.equal(got, want), f"{where}: 1-bit Adam rank {r} differs from rank 0 after step {t + 1}"
    # Bytes of one call on 2^18 float32s: about 1/32 of the dense allreduce (plus the signature exchange).
    birder, dense = ranks[0]["call_bytes"]
    # Flat: about 1/32 of dense. Hierarchical: the intra-node reduce-scatter is float32 by design (spec 4.1),
    # only the inter-node stages are 1-bit, so the total is (m-1)/m of a float32 buffer plus bits.
    bound = dense / 28 if not local else dense / 2.5
    assert birder < bound, f"{where}: Birder sent {birder} bytes, the dense allreduce {dense}"
    print(f"{where}: bytes sent per call on 2^18 floats: Birder {birder}, dense {dense} ({dense / birder:.1f}x); "
          f"optimizer step on {ranks[0]['numel']} params: Birder {ranks[0]['bytes_per_step']:.0f}, "
          f"dense {ranks[0]['dense_bytes_per_step']:.0f}")


def _alg1_grads(t: int, world: int, numel: int) -> np.ndarray:
    """tests/workers/birder_alg1.py's gradients of step t, one row per rank."""
    return np.stack([torch.randn(numel, generator=torch.Generator().manual_seed(1000 * t + r)).numpy()
                     for r in range(world)])


def _alg1_case(local: int, bucket_mb: int | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """birder_alg1.py's arguments and environment (HVDC_LOCAL_SIZE: nodes of ``local`` ranks; 0: flat)."""
    extra = (str(bucket_mb / (1 << 20)),) if bucket_mb else ()
    return ("1" if local else "0", *extra), ({"HVDC_LOCAL_SIZE": str(local)} if local else {})


ALG1 = [(3, 0, None), (4, 2, None), (3, 0, 2048), (4, 2, 2048)]


@pytest.fixture(scope="module")
def alg1(tmp_path_factory) -> Cases:
    """The cases of a world size in one launch (each size has one node layout, read at init)."""
    cases = {world: [_alg1_case(local, mb) for w, local, mb in ALG1 if w == world] for world in (3, 4)}
    return Cases("birder_alg1.py", cases, tmp_path_factory.mktemp("birder_alg1"), timeout_per_case=120)


@pytest.mark.parametrize(("world", "local", "bucket_mb"), ALG1, ids=["n3", "2x2", "n3-buckets", "2x2-buckets"])
def test_optimizer_equals_algorithm_1_element_by_element(world: int, local: int, bucket_mb: int | None,
                                                         alg1: Cases) -> None:
    """8 steps of op=hc.Birder against Alg. 1 written out here in NumPy, unsharded (spec 3, lines 4-13): each
    worker's m, b from its (node-mean, when hierarchical) gradient, r = m / (b + eps), the element-wise worker and
    server quantization of hvd_compress.reference.birder with the core's Philox draws, x -= lr u. Exact. With
    ``bucket_mb`` (bytes here) the optimizer's buckets are [p0, p1] and [p2]: Alg. 1 runs on each bucket alone,
    its own padding, and its own key ``ref.bucket_seed(seed, i)``."""
    ranks = alg1.ranks(world, _alg1_case(local, bucket_mb))
    m_loc = local or 1
    workers = world // m_loc
    buckets = ranks[0]["buckets"]
    assert buckets == ([[300, 7], [1000]] if bucket_mb else [[300, 7, 1000]]), buckets
    x = ranks[0]["params"][0].numpy().copy()
    d = x.size
    f32 = np.float32
    m, b = np.zeros((workers, d), f32), np.zeros((workers, d), f32)
    werr, serr = np.zeros((workers, d), f32), np.zeros(d, f32)
    cuts = np.cumsum([0, *(sum(s) for s in buckets)])
    for t in range(1, len(ranks[0]["params"])):
        g = _alg1_grads(t, world, d).astype(f32)
        node = g[::m_loc].copy()  # node means: float32 sum in local-rank order, one division (spec 4.1)
        for lp in range(1, m_loc):
            node = (node + g[lp::m_loc]).astype(f32)
        node = (node / f32(m_loc)).astype(f32)
        m = (f32(0.95) * m + f32(0.05) * node).astype(f32)
        b = (f32(0.95) * b + f32(0.05) * np.abs(node)).astype(f32)
        for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            dpad = ref.padded_numel(int(hi - lo), world)
            u = ref.parameter_server_step((m[:, lo:hi] / (b[:, lo:hi] + f32(1e-8))).astype(f32), werr[:, lo:hi],
                                          serr[lo:hi], ref.draw_uniforms(ref.bucket_seed(5, i), t, workers, dpad))
            x[lo:hi] = (x[lo:hi] - f32(0.01) * u).astype(f32)
        for r in range(world):
            got = ranks[r]["params"][t].numpy()
            off = np.flatnonzero(got != x)
            assert off.size == 0, (
                f"world {world}, local size {local}, buckets {buckets}: rank {r} step {t}: {off.size} of {d} "
                f"parameters differ from Alg. 1, first {off[0]}: got {got[off[0]]}, want {x[off[0]]}"
            )


def test_unequal_nodes_raise_on_every_rank(out_dir) -> None:
    """World 3 with HVDC_LOCAL_SIZE=2: the hierarchical step raises UsageError on every rank, no hang."""
    res = mpirun("birder_bad.py", 3, out_dir, env={"HVDC_LOCAL_SIZE": "2"}, timeout=120)
    ranks = load_ranks(out_dir, 3)
    for r in range(3):
        assert any(k in ranks[r]["outcome"] for k in USAGE) and "equal size" in ranks[r]["outcome"], (
            f"rank {r}: {ranks[r]['outcome']}\n{res.stdout[-2000:]}"
        )
        assert ranks[r]["unchanged"], f"rank {r}: state changed"
