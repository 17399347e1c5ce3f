"""hvd_compress: communication-efficient reductions for data-parallel training on Horovod.

Faces: ``hvd_compress.torch``. ``python -m hvd_compress --check-build`` prints what is built and in use.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("hvd_compress")
except _metadata.PackageNotFoundError:  # an in-place build that was never pip-installed
    __version__ = "0.1.0"
