"""Call names as the core reads them: a name may carry details after a "|" ("key=value" lines: an optimizer's op,
options and hyper-parameters), hashed with the name into every call's signature; messages show the part before
the "|", and a mismatch names each detail that differs with every rank's value (``cpp/src/signature.cc``). A
suffix that tells a call's parts apart belongs to the shown part, never to the last detail."""

from __future__ import annotations


def suffixed(name: str, suffix: str) -> str:
    """``name`` with ``suffix`` added to the part messages show."""
    shown, bar, details = name.partition("|")
    return f"{shown}{suffix}{bar}{details}"


def indexed(name: str, i: int) -> str:
    """``name`` with ``.i`` added to the part messages show."""
    return suffixed(name, f".{i}")
