"""Horovod's own entry points accept hvd_compress's ops: the routing that the faces share.

A face (``hvd_compress.torch``, ``hvd_compress.keras``) registers, at its import, which functions of which Horovod
module it takes over and what runs instead (``register``). A call is routed to hvd_compress when its ``op`` is one
of hvd_compress's own constants (an ``ReduceOp`` member) other than the dense ones (``Average``, ``Sum``, ``Min``,
``Max``, ``Product``): ``Adasum`` and the optimizer algorithms. Horovod's constants (plain ints, including
``hvd.Adasum``), the dense ops and calls without ``op`` run Horovod's own function, unchanged. A face may route a
function on another test of its arguments (``Routed``): ``hvd.broadcast_optimizer_state`` on an optimizer that
hvd_compress wrapped, whose state Horovod's own function cannot broadcast; ``hvd.join`` once hvd_compress's
runtime runs (``join_first``). A Horovod class whose path is known only later (a callback sees the model once
training begins) has one method extended in place (``Extended``).

One switch for the process: ``HVDC_HOROVOD_ENTRY=0`` in the environment leaves Horovod untouched, and
``horovod_entry(False)`` / ``horovod_entry(True)`` (``hc.horovod_entry``, ``hck.horovod_entry``) restores or
re-installs every registered face's routing; a face imported after ``horovod_entry(False)`` stays off.
No framework is imported here: the faces name their modules and functions.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, NamedTuple

from hvd_compress.ops.constants import DENSE_OPS, AlgorithmOp, ReduceOp

Adapt = Callable[[inspect.Signature, dict[str, Any]], dict[str, Any]]
#: Which calls go to hvd_compress: a test of the arguments Horovod's function was given, by its parameter names.
When = Callable[[dict[str, Any]], bool]


class Routed(NamedTuple):
    """Our function for a Horovod function, routed when ``when(arguments)`` holds instead of on ``op``;
    ``as_given``: it takes Horovod's arguments as they are, not as the face turns an optimizer's."""

    fn: Callable[..., Any]
    when: When
    as_given: bool = False


class Extended(NamedTuple):
    """A method of a Horovod class, named ``"Class.method"``, replaced by ``make(Horovod's method)``. In place, not
    by a subclass in the class's stead: Horovod's methods name their class (``super(Class, self)``), which would
    then find the subclass and call themselves again."""

    make: Callable[[Callable[..., Any]], Callable[..., Any]]


#: What a face takes over: (Horovod's module, {function name: our function or a ``Routed``; "Class.method": an
#: ``Extended``}), and optionally how to turn the arguments Horovod's function was given (by its parameter names)
#: into our function's keyword arguments.
Target = tuple[ModuleType, dict[str, "Callable[..., Any] | Routed | Extended"]]

_faces: dict[str, tuple[Callable[[], Iterable[Target]], Adapt | None]] = {}
#: (module, name) -> (the module or class holding it, the attribute, Horovod's own; None: the class inherited it)
_installed: dict[tuple[str, str], tuple[Any, str, Any]] = {}
_switched: bool | None = None  # set by horovod_entry(); None: follow HVDC_HOROVOD_ENTRY


def ours(op: Any) -> bool:
    """Whether ``op`` is routed to hvd_compress: an hvd_compress constant that is not a dense reduction, or an
    hvd_compress optimizer class named for its algorithm (``hc.Birder`` is the optimizer and, as ``op=``, the
    algorithm)."""
    if isinstance(op, type):
        return op.__module__.startswith("hvd_compress.") and isinstance(getattr(op, "hvdc_op", None), AlgorithmOp)
    return isinstance(op, AlgorithmOp) or (isinstance(op, ReduceOp) and op not in DENSE_OPS)


def _op_is_ours(given: dict[str, Any]) -> bool:
    return ours(given.get("op"))


def join_first(horovods_join: Callable[..., Any]) -> Routed:
    """Horovod's ``join`` once hvd_compress's runtime runs: hvd_compress's ``join`` first, then Horovod's (its own
    collectives may still be pending). With uneven data a rank waiting in Horovod's join alone would leave the ranks
    still stepping waiting for it in hvd_compress's collectives until the timeout; in ours every rank raises
    ``MismatchError`` naming it at once. ``horovods_join``: Horovod's own function."""
    from hvd_compress.ops import runtime
    from hvd_compress.ops.collectives import join

    def joined(**given: Any) -> Any:
        join()
        return horovods_join(**given)

    return Routed(joined, lambda _given: runtime.is_initialized(), as_given=True)


def route(original: Any, our_fn: Callable[..., Any], adapt: Adapt | None = None, when: When = _op_is_ours) -> Any:
    """``original`` (Horovod's function) with the calls ``when`` picks (default: ``op`` is ours) sent to ``our_fn``
    instead."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def entry(*args: Any, **kwargs: Any) -> Any:
        # Horovod's parameters by name (its positional order differs from ours); the rest are our options
        # (freeze_step=...), which Horovod's own function would refuse.
        known = {k: v for k, v in kwargs.items() if k in signature.parameters}
        given = signature.bind_partial(*args, **known).arguments
        if not when(given):
            return original(*args, **kwargs)
        if adapt is not None:
            given = adapt(signature, dict(given))
        return our_fn(**given, **{k: v for k, v in kwargs.items() if k not in known})

    entry.__hvdc_original__ = original  # type: ignore[attr-defined]
    return entry


def _enabled() -> bool:
    if _switched is not None:
        return _switched
    return os.environ.get("HVDC_HOROVOD_ENTRY", "1").strip() != "0"


def _install(face: str) -> None:
    targets, adapt = _faces[face]
    for module, functions in targets():
        for name, ours_ in functions.items():
            key = (module.__name__, name)
            if key in _installed:
                continue
            if isinstance(ours_, Extended):
                class_name, attribute = name.split(".")
                owner = getattr(module, class_name)
                original = getattr(owner, attribute)
                _installed[key] = (owner, attribute, owner.__dict__.get(attribute))
                setattr(owner, attribute, ours_.make(original))
                continue
            original = getattr(module, name)
            _installed[key] = (module, name, original)
            routed = ours_ if isinstance(ours_, Routed) else Routed(ours_, _op_is_ours)
            setattr(module, name, route(original, routed.fn, None if routed.as_given else adapt, routed.when))


def horovod_entry(enabled: bool = True) -> bool:
    """Route Horovod's entry points for hvd_compress's ops (``enabled``), or restore Horovod's own, for every
    face imported so far and the ones imported later. Returns whether a routing is now in place (False where
    Horovod is not installed)."""
    global _switched
    _switched = bool(enabled)
    if not enabled:
        for owner, attribute, original in _installed.values():
            if original is None:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)
        _installed.clear()
        return False
    for face in _faces:
        _install(face)
    return bool(_installed)


def register(face: str, targets: Callable[[], Iterable[Target]], adapt: Adapt | None = None) -> None:
    """At a face's import: remember what it routes (``targets()`` yields nothing where Horovod is absent), and
    install it unless the routing is switched off (``HVDC_HOROVOD_ENTRY=0`` or ``horovod_entry(False)``)."""
    _faces[face] = (targets, adapt)
    if _enabled():
        _install(face)
