"""Horovod's entry points accept hvd_compress's ops (and Horovod's own ops stay Horovod's); switchable off. The torch
entries, then the Keras one (horovod.tensorflow.keras / horovod.keras DistributedOptimizer; TF costs seconds per
process to import, so one launch checks the routing and the call switch, one the environment switch)."""

from __future__ import annotations

import pytest
import torch
from mpi_harness import load_pickled_ranks, load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3])
def test_hvd_distributed_optimizer_and_allreduce_route_our_ops_to_hc(n: int, out_dir) -> None:
    mpirun("horovod_entry.py", n, out_dir, "on", timeout=240)
    ranks = load_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        assert rk["hvd_onebit"] == rk["hc_onebit"], f"n={n} rank {r}: hvd.DistributedOptimizer(op=OneBitAdam) != hc's"
        assert rk["hvd_onebit"] == ranks[0]["hvd_onebit"], f"n={n}: rank {r} parameters differ from rank 0"
        assert rk["types"][:2] == [True, True], f"rank {r}: not hc wrappers: {rk['types']}"
        ours, ref = rk["adasum"]
        assert torch.equal(ours, ref), f"n={n} rank {r}: hvd.allreduce(op=hc.Adasum) is not hc's Adasum"
        theirs, ref = rk["hvd_average"]
        assert torch.allclose(theirs, ref, atol=1e-6), f"n={n} rank {r}: Horovod's own Average changed"
        assert rk["off"].startswith("TypeError") and "freeze_step" in rk["off"], f"rank {r}: {rk['off']}"
        assert rk["types"][-1] is False, f"rank {r}: Horovod's own optimizer was not Horovod's"


def test_environment_switch_leaves_horovod_untouched(out_dir) -> None:
    mpirun("horovod_entry.py", 2, out_dir, "off", env={"HVDC_HOROVOD_ENTRY": "0"}, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        assert rk["off"].startswith("TypeError") and "freeze_step" in rk["off"], f"rank {r}: {rk['off']}"


def test_keras_distributed_optimizer_routes_our_ops_to_hck(out_dir) -> None:
    pytest.importorskip("tensorflow")
    mpirun("horovod_entry_keras.py", 2, out_dir, "on", timeout=300)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for op in ("adasum", "onebit"):
            assert rk[f"{op}_type"] == "hck", f"rank {r}: op={op} did not return hck's wrapper: {rk[f'{op}_type']}"
            hashes, moved = rk[op]
            assert moved and len(hashes) == 3, f"rank {r}: op={op}: model.fit did not train 3 steps"
            assert hashes == ranks[0][op][0], f"op={op}: rank {r} parameters differ from rank 0 during model.fit"
        assert rk["onebit_compressed"], f"rank {r}: 1-bit Adam never reached its compressed stage"
        assert rk["onebit"] == rk["onebit_hck"], f"rank {r}: hvd.DistributedOptimizer(op=OneBitAdam) != hck's"
        assert rk["legacy"] == "hck", f"rank {r}: horovod.keras was not routed: {rk['legacy']}"
        for key in ("hvd_plain", "hvd_average", "hc_average"):
            assert rk[key].startswith("horovod."), f"rank {r}: {key} is not Horovod's own optimizer: {rk[key]}"
        assert rk["hvd_adasum"].startswith("raised ValueError"), f"rank {r}: Horovod's Adasum changed: {rk}"
        assert rk["refused"].startswith("TypeError") and "gradient_predivide_factor" in rk["refused"], rk["refused"]
        assert rk["averaged_passes"] == ("hck", True, 2), f"rank {r}: average_aggregated_gradients not kept"
        for key in ("switched_off", "switched_off_legacy"):  # hck.horovod_entry(False): Horovod refuses Adasum
            assert rk[key].startswith("raised ValueError"), f"rank {r}: {key}: {rk[key]}"


def test_keras_environment_switch_leaves_horovod_untouched(out_dir) -> None:
    pytest.importorskip("tensorflow")
    mpirun("horovod_entry_keras.py", 2, out_dir, "off", env={"HVDC_HOROVOD_ENTRY": "0"}, timeout=300)
    for r, rk in enumerate(load_pickled_ranks(out_dir, 2)):
        assert rk["env_off"].startswith("raised ValueError"), f"rank {r}: routed despite HVDC_HOROVOD_ENTRY=0: {rk}"
        assert rk["switched_on"] and rk["after_switch_on"] == "hck", f"rank {r}: hck.horovod_entry(True): {rk}"
