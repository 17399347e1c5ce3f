"""Benchmarks of hvd_compress collectives against Horovod's, run by ``make bench``."""
