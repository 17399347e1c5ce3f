"""The settings read once at ``init()`` (hvd_compress.ops.runtime.Config): parsed from the environment, bad
values named, and a bad value raises on every rank instead of leaving the others waiting."""

from __future__ import annotations

from mpi_harness import USAGE, load_ranks, mpirun

from hvd_compress.ops.runtime import Config


def test_settings_parse_and_bad_values_are_named():
    c = Config.from_env({})
    # A live peer elsewhere (rank 0 alone evaluating) is waited for an hour, with a warning every minute.
    want = (3600.0, 60.0, False, 0, False, "")
    assert (c.timeout_s, c.stall_warning_s, c.adasum_hierarchical, c.local_size, c.scalar_kernels, c.invalid) == want
    c = Config.from_env({"HVDC_TIMEOUT": "12", "HVDC_ADASUM_HIERARCHICAL": "1", "HVDC_LOCAL_SIZE": "2",
                         "HVDC_ONEBIT_KERNELS": "scalar", "HVDC_STALL_WARNING": "0"})
    assert (c.timeout_s, c.stall_warning_s, c.adasum_hierarchical, c.local_size, c.scalar_kernels, c.invalid) == (
        12.0, 0.0, True, 2, True, "")
    assert Config.from_env({"HVDC_STALL_WARNING": "2.5"}).stall_warning_s == 2.5
    for raw in ("-1", "soon", "nan", "inf"):
        assert f"HVDC_STALL_WARNING={raw}" in Config.from_env({"HVDC_STALL_WARNING": raw}).invalid, raw
    assert "HVDC_TIMEOUT" in Config.from_env({"HVDC_TIMEOUT": "nan"}).invalid
    assert not Config.from_env({"HVDC_ONEBIT_KERNELS": "auto"}).scalar_kernels
    assert (c.onebit_piece, Config.from_env({"HVDC_ONEBIT_PIPELINE": "0"}).onebit_piece) == (-1, 0)
    assert "HVDC_ONEBIT_PIPELINE" in Config.from_env({"HVDC_ONEBIT_PIPELINE": "-5"}).invalid
    bad = Config.from_env({"HVDC_TIMEOUT": "soon", "HVDC_LOCAL_SIZE": "0", "HVDC_ONEBIT_KERNELS": "avx512"})
    for name in ("HVDC_TIMEOUT", "HVDC_LOCAL_SIZE", "HVDC_ONEBIT_KERNELS"):
        assert name in bad.invalid, bad.invalid


def test_a_bad_setting_raises_on_every_rank(out_dir):
    mpirun("config_invalid.py", 2, out_dir, env={"HVDC_ONEBIT_KERNELS": "avx512"}, timeout=120)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        assert rk["init"].startswith(USAGE) and "HVDC_ONEBIT_KERNELS=avx512" in rk["init"], f"rank {r}: {rk}"
