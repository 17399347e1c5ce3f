"""Plumbing shared by the torch optimizer wrappers: one subclass of the wrapped optimizer's class that delegates
to an ``Engine`` (so that ``isinstance``, LR schedulers and ``state_dict()`` keep working), the gradient hooks and
Horovod's ``synchronize()``/``skip_synchronize()`` protocol. Pass counting and byte metering are framework-neutral
(``hvd_compress.ops.passes``, ``hvd_compress.ops.traffic``)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import UsageError, warn_per_rank_state
from hvd_compress.ops.traffic import not_counting
from hvd_compress.torch import checkpoint
from hvd_compress.torch.checkpoint import WORLD_KEY
from hvd_compress.torch.functions import allreduce

STATE_KEY = "hvd_compress"  # the section of state_dict() that holds a wrapper's own state
#: Why a change of ``.grad`` after backward is refused where a parameter without a gradient held back buckets.
HELD_BACK = (
    "{name}: .grad was changed between backward() and {until} while some buckets held averaged gradients and later "
    "ones this rank's own: a parameter without a gradient in this step holds back its bucket and the later ones, so "
    "a change such as clipping by the gradient norm saw both and would step the ranks apart. Call "
    "opt.synchronize() before changing .grad (then step() inside opt.skip_synchronize()), or pass overlap=False"
)


#: The entry of a wrapper's section of ``state_dict()`` that names the rank which wrote it.
SAVED_BY = "rank"


def _this_rank() -> int | None:
    """This rank; None where no job was started (one process without ``init()``: no other rank to tell apart).
    Local: it never starts hvd_compress's runtime, whose set-up is a collective that a call made on one rank alone
    (rank 0's ``load_state_dict`` in Horovod's resume) would wait in forever; Horovod's rank serves until then."""
    world = checkpoint.local_world()
    return None if world is None else world[0]


def own_section(section: dict[str, Any]) -> dict[str, Any]:
    """A wrapper's section of ``state_dict()``, marked as this rank's (its error feedback is this rank's), with the
    world size of the job (a load at another size is refused on every rank where the op cannot take it)."""
    world = checkpoint.local_world()
    return {**section, SAVED_BY: None if world is None else world[0], WORLD_KEY: None if world is None else world[1]}


def _another_ranks_section(section: dict[str, Any] | None, name: str, what: str = "error feedback") -> bool:
    """Whether ``section`` was written by another rank: Horovod's resume, where rank 0's checkpoint is loaded on
    every rank, or broadcast (``broadcast_optimizer_state``). Its error feedback is that rank's residual, which here
    would count it once more in the ranks' sum and drop this rank's, so the caller starts this rank's from zero (as
    DeepSpeed does on every load) and keeps the rest. Warns. A section without a rank (older, or written outside a
    job) counts as this rank's."""
    here = _this_rank()
    saved_by = (section or {}).get(SAVED_BY)
    if saved_by is None or here is None or saved_by == here:
        return False
    warn_per_rank_state(f"{name}.load_state_dict: the checkpoint was written by rank {saved_by}; rank {here} starts "
                  f"its {what} from zero (the rest of the state is loaded). For an exact resume, save "
                  "hc.full_optimizer_state_dict(opt) (every rank calls it; rank 0 saves the dict it returns), or "
                  "each rank its own state_dict()", stacklevel=5)
    return True


#: The methods every wrapped optimizer delegates to its engine; an engine adds its own in ``exports``.
COMMON = ("synchronize", "skip_synchronize", "step", "zero_grad", "state_dict", "load_state_dict", "comm_stats",
          "set_backward_passes_per_step")


def compose(optimizer: torch.optim.Optimizer, engine_cls: type[Engine], *args: Any,
            **kwargs: Any) -> torch.optim.Optimizer:
    """A new optimizer of one subclass of ``type(optimizer)``, on the same param groups and with the same state,
    holding ``engine_cls(new, base, *args, **kwargs)`` as ``_hvdc``: its only attribute beside the base class's.
    The subclass adds one delegate per name of ``COMMON`` and ``engine_cls.exports`` and nothing else, so
    ``isinstance(new, type(optimizer))``, LR schedulers and ``state_dict()`` keep working (as Horovod's wrapper).

    Wrapping an hvd_compress wrapper again wraps the optimizer inside it (its own section of the state is dropped):
    two layers would each reduce the gradients."""
    inner = wrapped_engine(optimizer)
    base = inner.base if inner is not None else type(optimizer)
    names = dict.fromkeys(COMMON + engine_cls.exports)
    methods: dict[str, Any] = {name: _delegate(engine_cls, name) for name in names}
    if engine_cls.amp_scaling:
        methods["_step_supports_amp_scaling"] = True  # torch's GradScaler hands itself to step()
    cls = type(base.__name__, (base,), methods)
    state = base.state_dict(optimizer)
    wrapped = cls.__new__(cls)
    accepted = inspect.signature(base.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    base.__init__(wrapped, optimizer.param_groups, **defaults)
    base.load_state_dict(wrapped, state)
    # As Horovod's wrapper: the param groups are the wrapped optimizer's own, so that an LR scheduler made on it
    # before wrapping, an edit of its param_groups and its add_param_group act on the steps (the engine reads the
    # hyper-parameters there); torch's load_state_dict above made copies.
    wrapped.param_groups = optimizer.param_groups
    wrapped._hvdc = engine_cls(wrapped, base, *args, **kwargs)
    return wrapped


@contextlib.contextmanager
def param_groups_kept(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Around torch's ``load_state_dict``, which replaces the param-group dicts (and their list) with new ones: the
    loaded values go into the dicts that were there, so that they stay the ones the wrapped optimizer shares
    (``compose``) and an LR scheduler made on it before wrapping still acts after a resume."""
    groups = optimizer.param_groups
    try:
        yield
    finally:
        _keep(optimizer, groups)


def _keep(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    loaded = optimizer.param_groups
    if loaded is groups or len(loaded) != len(groups):
        return
    for kept, new in zip(groups, loaded, strict=True):
        if kept is not new:
            kept.clear()
            kept.update(new)
    optimizer.param_groups = groups


def wrapped_engine(optimizer: Any) -> Engine | None:
    """The engine of an optimizer that ``compose`` built, else None."""
    engine = vars(optimizer).get("_hvdc") if hasattr(optimizer, "__dict__") else None
    return engine if isinstance(engine, Engine) else None


def _delegate(engine_cls: type, name: str) -> Any:
    """``name`` of the wrapped optimizer: the engine's property or method of that name, called on ``self._hvdc``."""
    target = inspect.getattr_static(engine_cls, name)
    if isinstance(target, property):
        return property(lambda self: getattr(self._hvdc, name), doc=target.__doc__)

    def call(engine: Engine, *args: Any, **kwargs: Any) -> Any:
        if name == "step":
            engine.check_param_groups()
            checkpoint.before_step(engine)
        elif name == "load_state_dict":  # every rank's part of a full state dict, or a refusal kept for all ranks
            with param_groups_kept(engine.opt):
                return checkpoint.load(engine, *args, name="DistributedOptimizer", **kwargs)
        return getattr(engine, name)(*args, **kwargs)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "comm_stats":
            return self._hvdc.comm_stats()
        # every collective of the call counts as this optimizer's (the agreements on edited gradients and on a
        # GradScaler's verdict too); a closure's own do not (``closure_loss``)
        return self._hvdc.meter.run(call, self._hvdc, *args, **kwargs)

    functools.update_wrapper(method, target)  # its name, docstring and signature (grad_scaler= for torch's scaler)
    return method


# The hvd_compress hook of each parameter, by id (checked against a weak reference: tensors compare
# element-wise, so they cannot key a WeakKeyDictionary). Not an attribute of the parameter: a deep copy
# of the model would copy it, and wrapping the copy would then remove the original's hook.
_hooks: dict[int, tuple[weakref.ref, Any]] = {}


def hook_gradients(
    params: Iterable[torch.nn.Parameter],
    callback: Callable[[torch.Tensor], None],
    before: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> None:
    """Call ``callback(p)`` (a bound method of the wrapper) whenever ``p``'s gradient is accumulated, and
    ``before(p, grad)`` (also a bound method), when given, with each incoming gradient before it is.

    A parameter carries at most one set of hvd_compress hooks: a new wrapper on the same model removes the
    previous wrapper's hooks, so a dropped wrapper never counts passes or launches collectives again. The
    hooks hold the wrapper weakly, so that dropping it frees it (and its buffers and threads).
    """
    ref = weakref.WeakMethod(callback)
    before_ref = weakref.WeakMethod(before) if before is not None else None

    def hook(p: torch.Tensor) -> None:
        fn = ref()
        if fn is not None:
            fn(p)

    for p in params:
        key = id(p)
        previous = _hooks.get(key)
        if previous is not None and previous[0]() is p:
            for handle in previous[1]:
                handle.remove()
        handles = [p.register_post_accumulate_grad_hook(hook)]
        if before_ref is not None:
            handles.append(p.register_hook(_before_hook(before_ref, weakref.ref(p))))
        _hooks[key] = (weakref.ref(p, lambda _, key=key: _hooks.pop(key, None)), handles)


def _before_hook(fn_ref: weakref.WeakMethod, p_ref: weakref.ref) -> Callable[[torch.Tensor], None]:
    """A tensor hook calling ``fn_ref()(p, grad)``; it holds neither the wrapper nor the parameter."""

    def hook(grad: torch.Tensor) -> None:
        fn, p = fn_ref(), p_ref()
        if fn is not None and p is not None:
            fn(p, grad)

    return hook


SYNC_WARNING = (
    "optimizer.step() called without optimizer.skip_synchronize() context after optimizer.synchronize(). "
    "This can cause training slowdown. You may want to consider using optimizer.skip_synchronize() "
    "context if you use optimizer.synchronize() in your code."
)


def _same(consumed: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """What a consumer of fused buffers hands ``changed_since_backward``: ``.grad`` are views of them."""
    return consumed


class SynchronizeProtocol:
    """Horovod's ``synchronize()`` / ``skip_synchronize()`` contract, one object per engine.

    An engine's ``synchronize()`` ends the gradient phase and calls ``mark_synchronized``; its ``step()`` asks
    ``for_step`` first whether to run the gradient phase itself, else (``seen`` set) whether the gradients were
    ``edited`` since. Unlike Horovod, a ``step()`` after ``synchronize()`` without ``skip_synchronize()``
    warns (Horovod's text) but does not reduce the same gradients a second time (Horovod does, which makes
    ``op=Sum`` steps n times larger); and ``step()`` inside ``skip_synchronize()`` with no ``synchronize()``
    since the last step raises instead of letting the ranks step on their local gradients and drift apart.
    """

    def __init__(self) -> None:
        self.synchronized = False
        self.skip = False
        self.seen: list[int] | None = None  # ``gradient_fingerprint`` of what a user's synchronize() consumed
        # What the hooks consumed by the end of backward, its versions and fingerprint (``remember_backward``)
        self.seen_at_backward: tuple[list[torch.Tensor | None], list[int], list[int]] | None = None

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this context uses the gradients of the preceding ``synchronize()``."""
        self.skip = True
        try:
            yield
        finally:
            self.skip = False

    def mark_synchronized(self) -> None:
        self.synchronized = True

    def remember(self, consumed: list[torch.Tensor | None]) -> None:
        """At the end of a user's ``synchronize()``: fingerprint the gradients it consumed as they were (rather
        than reduced into ``.grad``), for ``for_step`` to compare."""
        self.seen = gradient_fingerprint(consumed) if consumed else None

    def remember_backward(self, consumed: list[torch.Tensor | None]) -> None:
        """At the end of a backward pass whose hooks consumed the gradients ``consumed`` as they were: fingerprint
        them, for ``edited_since_backward`` (DDP's clipping: ``.grad`` changed between ``backward()`` and
        ``step()`` with no ``synchronize()``)."""
        self.seen_at_backward = (consumed, _versions(consumed), gradient_fingerprint(consumed)) if consumed else None

    def changed_since_backward(self, now: Callable[[list[torch.Tensor | None]], list[torch.Tensor | None]] = _same
                               ) -> bool:
        """Whether this rank changed what ``remember_backward`` fingerprinted (``now(consumed)``: those gradients as
        they are now, replaced ones too; nothing remembered changed nothing). Local, no collective: the caller makes
        the answer every rank's. Tensors not written since (the same tensors, their version counters unchanged) are
        not read again."""
        seen, self.seen_at_backward = self.seen_at_backward, None
        if seen is None:
            return False
        current = now(seen[0])
        same = all(a is b for a, b in zip(current, seen[0], strict=True)) and _versions(current) == seen[1]
        return not same and gradient_fingerprint(current) != seen[2]

    def edited_since_backward(self, now: Callable[[list[torch.Tensor | None]], list[torch.Tensor | None]] = _same
                              ) -> bool:
        """In a ``step()`` with no ``synchronize()``: whether any rank changed what its hooks consumed since the
        end of backward (``changed_since_backward``). One small allreduce: every rank calls it alike."""
        return any_rank(self.changed_since_backward(now), "DistributedOptimizer.gradients_edited")

    def for_step(self) -> bool:
        """At the start of ``step()``: True when no ``synchronize()`` preceded it, so ``step()`` runs the gradient
        phase itself; raises inside ``skip_synchronize()`` without a ``synchronize()`` since the last step."""
        if self.skip:
            if not self.synchronized:
                raise RuntimeError(
                    "step() inside skip_synchronize() needs a synchronize() since the last step; without it "
                    "every rank would step on its own gradients and the ranks' parameters would diverge"
                )
        elif self.synchronized:
            warnings.warn(SYNC_WARNING, stacklevel=4)
        else:
            self.seen = None
            return True
        self.seen_at_backward = None  # synchronize() ran after backward: ``seen`` is what counts
        return False

    def edited(self, consumed: list[torch.Tensor | None]) -> bool:
        """After a user's ``synchronize()`` that remembered what it consumed (``seen`` is set): whether any rank
        changed those gradients (``consumed``, as they are now) since (clipping between ``synchronize()`` and
        ``step()``). Every rank gets the same answer, so every rank honours (or refuses) the change alike."""
        seen, self.seen = self.seen, None
        return any_rank(gradient_fingerprint(consumed) != seen, "DistributedOptimizer.gradients_edited")

    def step_done(self) -> None:
        self.synchronized = False
        self.seen_at_backward = None


class Engine:
    """What a wrapped optimizer holds as ``_hvdc`` and delegates ``COMMON`` and ``exports`` to: its buffers, hook
    targets, pass counter, byte meter, algorithm and ``SynchronizeProtocol``. It calls the wrapped optimizer's base
    class explicitly (``self.base.step(self.opt, closure)``) and holds the optimizer weakly (the optimizer holds
    it), so dropping the optimizer frees both. A subclass sets ``passes`` and ``meter`` and supplies
    ``synchronize`` and ``step``."""

    exports: tuple[str, ...] = ()
    #: What ``load_state_dict`` loaded since the last step, for the broadcast that follows (``checkpoint.Loaded``)
    loaded: checkpoint.Loaded | None = None
    amp_scaling = False  # whether ``step`` takes torch's ``grad_scaler=``
    end_queued = False  # ``at_end_of_backward`` has queued ``end_of_backward`` for the running backward pass
    frozen_later_ok = False  # whether a parameter frozen after wrapping is left unstepped (``check_param_groups``)

    def __init__(self, optimizer: torch.optim.Optimizer, base: type) -> None:
        self._opt = weakref.ref(optimizer)
        self.base = base
        self.protocol = SynchronizeProtocol()
        # What the engine reduces is fixed here: the groups' parameters that require a gradient now.
        self._layout = _group_layout(optimizer.param_groups)
        self._wrapped = [(g, i, p, p.requires_grad) for g, group in enumerate(optimizer.param_groups)
                         for i, p in enumerate(group["params"])]

    def zero_untracked_grads(self, set_to_none: bool) -> None:
        """What torch's ``zero_grad`` does to the groups' parameters frozen at wrapping, which the engine's buffers
        leave out: a gradient they kept from before the freeze would otherwise stay, and the wrapped optimizer
        would step them on it at every step."""
        for _, _, p, trainable in self._wrapped:
            if trainable or p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def check_param_groups(self) -> None:
        """Raise before a step whose parameters are not the ones the engine was built for: a group added or changed
        (``add_param_group``), a parameter frozen at wrapping and trainable now (gradual unfreezing), or one
        trainable at wrapping and frozen now (``requires_grad_(False)`` on a layer mid-run). An unfrozen one's
        gradients would stay each rank's own, and the ranks would step apart with no error (Horovod's and DDP's
        wrappers also fix their parameters when built); a frozen one would be stepped on a zero gradient (its
        momentum moves it, where torch's optimizer skips a parameter without a gradient). The same on every rank
        that changed them alike. Engines that step each parameter as its gradient lands (``frozen_later_ok``) leave
        a frozen one as torch does, and are not refused that."""
        opt = self.opt
        if _group_layout(opt.param_groups) != self._layout:
            what = "the optimizer's param groups changed (add_param_group() or an edit of param_groups)"
        else:
            changed = [(g, i, p) for g, i, p, was in self._wrapped if p.requires_grad != was]
            unfrozen = [c for c in changed if c[2].requires_grad]
            frozen = [] if self.frozen_later_ok else [c for c in changed if not c[2].requires_grad]
            if not unfrozen and not frozen:
                return
            g, i, p = (unfrozen or frozen)[0]
            what = (f"{len(unfrozen)} parameter(s) frozen (requires_grad=False) when it was built require a "
                    f"gradient now" if unfrozen else
                    f"{len(frozen)} parameter(s) trainable when it was built are frozen (requires_grad=False) now")
            what += f" (first: param group {g}, index {i}, shape {tuple(p.shape)})"
        raise UsageError(
            f"DistributedOptimizer: {what} since hvd_compress wrapped it; their gradients would not be reduced as "
            "torch's optimizer expects and the ranks' steps would be wrong. Wrap it again after the change, on "
            "every rank: opt = hc.DistributedOptimizer(opt, named_parameters, op=...) keeps the optimizer's groups "
            "and state (the wrapper's own, such as error feedback, starts anew; op=ZeroOneAdam past var_freeze_step "
            "refuses that, its u and x_anchor being per bucket: make such changes before the freeze); step not taken")

    @property
    def opt(self) -> torch.optim.Optimizer:
        """The wrapped optimizer."""
        return self._opt()

    def skip_synchronize(self) -> contextlib.AbstractContextManager[None]:
        """``step()`` inside this context uses the gradients of the preceding ``synchronize()``."""
        return self.protocol.skip_synchronize()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """As Horovod's: from now on the gradients of ``passes`` backward passes make one step."""
        self.passes.set_limit(passes)

    def comm_stats(self) -> dict[str, int]:
        """Bytes this rank sent and received for this optimizer since the last call."""
        return self.meter.take()

    def state_dict(self) -> dict[str, Any]:
        return self.base.state_dict(self.opt)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.base.load_state_dict(self.opt, state_dict)

    def error_feedback(self) -> list[torch.Tensor]:
        """This rank's error-feedback buffers, in a fixed order (none for an op without)."""
        return []

    def reset_error_feedback(self) -> None:
        for e in self.error_feedback():
            e.zero_()

    def per_rank_what(self) -> str | None:
        """This op's state that is each rank's own, in words (for a warning); None where every rank's is alike."""
        return "error feedback" if self.error_feedback() else None

    def per_rank_fallback(self, root: int) -> str:
        """What a rank's per-rank state starts from when a broadcast of ``root``'s plain state dict lacks it."""
        return f"starts its error feedback from zero and takes the rest from rank {root}"

    def drop_another_ranks_error_feedback(self, section: dict[str, Any] | None, name: str,
                                          what: str = "error feedback") -> None:
        """After loading ``section`` (a wrapper's part of a checkpoint): where another rank wrote it, start this
        rank's error feedback (``what`` it is, for the warning) from zero, with a warning
        (``_another_ranks_section``)."""
        if self.error_feedback() and _another_ranks_section(section, name, what):
            self.reset_error_feedback()

    def load_broadcast_state(self, state_dict: dict[str, Any]) -> None:
        """Load another rank's ``state_dict()`` broadcast to this one, keeping this rank's error feedback (the Keras
        faces' broadcast leaves ``per_rank_variables`` alike): where this rank's buffers have the layout of the
        loaded ones, they keep their values; else (a rank whose state was still empty) they start from zero."""
        own = [e.clone() for e in self.error_feedback()]
        section = state_dict.get(STATE_KEY)
        if isinstance(section, dict):  # as this rank's: nothing to warn of
            state_dict = {**state_dict, STATE_KEY: own_section(section)}
        with param_groups_kept(self.opt):
            self.load_state_dict(state_dict)
        now = self.error_feedback()
        if [e.shape for e in now] == [e.shape for e in own]:
            for e, mine in zip(now, own, strict=True):
                e.copy_(mine)
        else:
            self.reset_error_feedback()


def at_end_of_backward(engine: Any) -> None:
    """From a gradient hook: have the autograd engine call ``engine.end_of_backward()`` once the running backward
    pass is over, once per pass however many hooks ask (a nested pass of reentrant checkpointing ends first, its
    own call; a hook of the outer pass after it asks again). Holds the engine weakly."""
    if engine.end_queued:
        return
    engine.end_queued = True
    ref = weakref.ref(engine)

    def end() -> None:
        engine = ref()
        if engine is not None:
            engine.end_queued = False
            engine.end_of_backward()

    torch.autograd.Variable._execution_engine.queue_callback(end)


def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """What every engine's ``step(closure)`` runs first: the closure, with grad enabled (``step`` may run under
    ``no_grad``), so that the gradients it computes are the ones reduced; its loss, or None without one. The
    closure's own collectives (a loss averaged over ranks) are not counted in the optimizer's ``comm_stats``."""
    if closure is None:
        return None
    with torch.enable_grad(), not_counting():
        return closure()


def _group_layout(groups: Iterable[dict[str, Any]]) -> list[tuple[int, ...]]:
    return [tuple(id(p) for p in group["params"]) for group in groups]


def gradient_fingerprint(tensors: Iterable[torch.Tensor | None]) -> list[int]:
    """Per tensor the sum of its bit patterns as 64-bit integers (wrapping): any change of one element changes it
    (several changes could cancel only by exact coincidence), at the cost of one read of the gradients. Whole
    64-bit words are summed where the bytes allow it (a wide integer sum is a fast reduction; a widening one is not),
    the rest element by element."""
    out = []
    for tensor in tensors:
        if tensor is None:
            out.append(-1)
            continue
        t = tensor.detach().coalesce().values() if tensor.is_sparse else tensor.detach()
        flat = t.reshape(-1)
        per_word = 8 // t.element_size() if t.element_size() < 8 and 8 % t.element_size() == 0 else 1
        whole = flat.numel() - flat.numel() % per_word
        total = 0
        if whole and per_word > 1 and flat.storage_offset() % per_word == 0:
            total = int(flat[:whole].view(torch.int64).sum())
            flat = flat[whole:]
        if flat.numel():
            bits = {8: torch.int64, 4: torch.int32, 2: torch.int16}.get(t.element_size(), torch.int8)
            total += int(flat.contiguous().view(bits).sum(dtype=torch.int64))
        out.append(total)
    return out


def _versions(tensors: Iterable[torch.Tensor | None]) -> list[int]:
    """The version counters of ``tensors`` (shared with their views: any in-place write bumps them)."""
    return [-1 if t is None else t._version for t in tensors]


def any_rank(flag: bool, name: str) -> bool:
    """Whether ``flag`` holds on any rank (one small allreduce; every rank must call it)."""
    return bool(allreduce(torch.tensor([float(flag)]), op=ReduceOp.Max, name=name).item() > 0)


def check_named_parameters(
    params: list[torch.nn.Parameter], named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None
) -> dict[int, str]:
    """Names by parameter id; every optimizer parameter must be named when names are given."""
    if named_parameters is None:
        return {id(p): f"param.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    seen: set[str] = set()
    duplicates = sorted({n for n, _ in named if n in seen or seen.add(n)})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names (as Horovod, they must be unique): {duplicates}")
    names = {id(p): n for n, p in named}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(
            f"named_parameters does not name {len(missing)} parameter(s) of the optimizer (first at index {missing[0]})"
        )
    return names


def unscaled(grad_scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``grad_scaler`` (a ``torch.amp.GradScaler``) has unscaled ``optimizer``'s gradients in this step."""
    return grad_scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED


def any_rank_nonfinite(grad_scaler: Any, optimizer: torch.optim.Optimizer, name: str) -> bool:
    """Unscale ``optimizer``'s gradients through ``grad_scaler`` (a ``torch.amp.GradScaler``) and OR its inf/NaN
    verdict over all ranks, written back into the scaler: every rank then skips or takes the step alike, and every
    rank's ``scaler.update()`` moves the scale the same way."""
    if not unscaled(grad_scaler, optimizer):  # not by the user yet
        grad_scaler.unscale_(optimizer)
    found = grad_scaler._found_inf_per_device(optimizer)
    local = sum(float(t.item()) for t in found.values())
    verdict = 1.0 if any_rank(local > 0, name) else 0.0
    for t in found.values():
        t.fill_(verdict)
    return verdict > 0
