"""NumPy simulation of every hvd_compress collective and optimizer over n virtual ranks in one process.

It is written from the papers, independently of the C++ core, and is the oracle the multi-rank tests
compare the real implementation against element by element. Each algorithm has its own module here,
named like its C++ counterpart in cpp/ (``allreduce.py`` beside ``dense_allreduce.cc``), so the two
can be read side by side. Inputs and outputs are lists with one array per virtual rank.
"""

from hvd_compress.reference.adasum import adasum, adasum_hierarchical
from hvd_compress.reference.allreduce import allreduce
from hvd_compress.reference.dtypes import round_to, ulp

__all__ = ["adasum", "adasum_hierarchical", "allreduce", "round_to", "ulp"]
