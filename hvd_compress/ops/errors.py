"""Exceptions raised by hvd_compress. Collective errors are raised on every rank alike."""

from __future__ import annotations

import sys
import warnings

from hvd_compress import _core

#: Bad input on some rank (dtype, device, layout); every rank raises it. A ``ValueError``.
UsageError = _core.UsageError
#: Some rank rejected its input to a collective (dtype, device, layout); every rank raises it. Both a
#: ``UsageError`` (so a ``ValueError``) and a ``RuntimeError``, what Horovod's users catch.
RejectedInputError = _core.RejectedInputError
#: Ranks called a collective with different shapes, dtypes, ops or names. A ``RuntimeError``.
MismatchError = _core.MismatchError
#: A peer did not join a collective within the timeout. A ``TimeoutError``.
CommTimeoutError = _core.CommTimeoutError
#: A peer left the job (its process exited normally) while this rank waited for it in a collective; the message
#: names that rank and the collective. A ``CommTimeoutError``, raised within seconds.
PeerExitedError = _core.PeerExitedError
#: The MPI library reported an error. A ``RuntimeError``.
CommError = _core.CommError


class NotInitializedError(RuntimeError):
    """A collective was called before ``hvd.init()`` or ``hc.init()``."""


class ProcessSetError(NotImplementedError):
    """A process set where this face or op takes the global set only (the TensorFlow face; DistributedOptimizer
    ops other than Average and Sum), or something that is no process set."""


class NotInProcessSetError(ValueError):
    """This rank called a collective with a process set it is not part of (only its members call them)."""


class LaunchError(RuntimeError):
    """The processes were not started by an MPI launcher, or Horovod and MPI disagree on the world."""


class PerRankStateWarning(UserWarning):
    """A load or broadcast of optimizer state left some rank without its own per-rank state (error feedback, local
    moments): the resume is not exact. Shown at every load, not once per process (Python's default for a warning
    of one place): each load is another checkpoint. A user's own filter for it comes first."""


def warn_per_rank_state(message: str, stacklevel: int = 1) -> None:
    """``warnings.warn(message, PerRankStateWarning, stacklevel)``, shown at every call that the filters let through:
    with no registry, Python's default action ("once per place") cannot hide a second load's warning, and nothing
    is added to the process's filters (a user's own for the category still decides)."""
    frame = sys._getframe(stacklevel)
    warnings.warn_explicit(message, PerRankStateWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"), registry=None)

#: What the core raises on every rank of a collective alike (a rank that sees one of these needs no rejection).
CORE_ERRORS = (UsageError, MismatchError, CommTimeoutError, CommError)
