"""A Horovod script that spells out Horovod's DistributedOptimizer arguments at their defaults (its MNIST examples
pass gradient_predivide_factor=1.0, compression=hvd.Compression.none, ...) keeps working with every hvd_compress op,
in the torch face (hc.DistributedOptimizer and the routed hvd.DistributedOptimizer) and the Keras face (model.fit);
a value other than the default is refused on every rank with a message that names it and lists everything the op
takes, and so is an unknown option."""

from __future__ import annotations

import pytest
from mpi_harness import load_pickled_ranks, load_ranks, mpirun

OWN = {  # options each op's message must list beside Horovod's
    "Average": ["bucket_mb", "overlap", "gradient_predivide_factor", "sparse_as_dense"],
    "Adasum": ["hierarchical", "bucket_mb"],
    "OneBitAdam": ["freeze_step", "variance_floor", "hierarchical", "bucket_mb", "overlap"],
    "OneBitLamb": ["freeze_step", "coeff_beta", "bucket_mb", "overlap"],
    "SLAMB": ["compress_ratio", "sync_interval", "bucket_mb", "overlap"],
    "Birder": ["hierarchical", "bucket_mb", "overlap"],
}


def _check_refusals(rk: dict, r: int, face: str) -> None:
    for case, message in rk["refused"].items():
        name, changed = case.split(" ", 1)
        where = f"{face} rank {r}: {case}"
        assert not message.startswith("no error"), f"{where}: accepted"
        if changed != "unknown":
            key = changed.split("=")[0]
            assert message.startswith("ValueError") and key in message, f"{where}: {message}"
        else:
            assert message.startswith("TypeError") and "no_such_option" in message, f"{where}: {message}"
        for option in OWN[name]:
            assert option in message, f"{where}: the message does not list {option}: {message}"
        assert "num_groups=0" in message, f"{where}: the message does not list Horovod's defaults: {message}"


def test_torch_takes_horovod_defaults_with_every_op(out_dir) -> None:
    mpirun("horovod_defaults.py", 2, out_dir, timeout=240)
    ranks = load_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for entry, result in rk["trained"].items():
            assert result == "no error", f"rank {r}: {entry} with Horovod's defaults: {result}"
        for name in OWN:
            assert rk[name] == ranks[0][name], f"op={name}: rank {r} parameters differ from rank 0"
            if name != "Average":
                assert rk[f"hvd.{name}"] == rk[name], f"rank {r}: hvd.DistributedOptimizer(op={name}) != hc's"
        _check_refusals(rk, r, "torch")


def test_keras_takes_horovod_defaults_with_every_op(out_dir) -> None:
    pytest.importorskip("tensorflow")
    mpirun("keras_horovod_defaults.py", 2, out_dir, timeout=300)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for name, result in rk["trained"].items():
            assert result == "no error", f"rank {r}: model.fit with op={name} and Horovod's defaults: {result}"
            assert rk[name] == ranks[0][name], f"op={name}: rank {r} parameters differ from rank 0 after model.fit"
        _check_refusals(rk, r, "keras")
