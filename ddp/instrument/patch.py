"""Patching a ``DistributedDataParallel`` class in place, so every instance reports.

The class itself is patched (its ``__init__``, ``forward``, ``register_comm_hook``), not
replaced by a subclass: a script may reach it as ``torch.nn.parallel.DistributedDataParallel``,
``torch.nn.parallel.distributed.DistributedDataParallel`` or through a name it imported
before, subclass it, or test ``isinstance`` and ``type(m).__name__``, and all of that stays
as it was. Each instance built gets a :class:`ddp.instrument.session.Probe` in
``_ddp_instrument``:

* torch's: the instrumentation's comm hook (:mod:`ddp.instrument.hook`) is registered at
  construction; the script's ``register_comm_hook`` (and ``_register_builtin_comm_hook``)
  puts its hook inside it, with torch's checks and torch's error on a second call.
* ours: the reducer's flight recorder is the step tally (wrapping the script's recorder if it
  passed one), and the script's hook runs as the reducer runs any hook.

A forward with grad enabled marks a step (see ``ddp.instrument.records``).
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

# torch imports torch.nn.parallel.distributed while it is itself being imported, so this module
# runs inside torch's import: it takes nothing from torch (or from modules that need torch) at
# import time, only when a DDP is built or called.
import torch

if TYPE_CHECKING:
    from ddp.instrument.session import Probe

__all__ = ["patch_ours", "patch_torch"]

_ATTR = "_ddp_instrument"
_ONCE = "register_comm_hook or register_builtin_comm_hook can only be called once."


def _probe(module: Any) -> Probe | None:
    return module.__dict__.get(_ATTR)


def _wanted() -> bool:
    """Whether a new DDP should report: ``DDP_INSTRUMENT`` is still 1 (this project's own
    training program, ``python -m ddp``, sets it to 0: it writes its own records to the same
    ``rank<R>.jsonl`` names), and the records go somewhere (``DDP_LOG_DIR`` or
    ``DDP_EMIT_RECORDS``)."""
    from ddp.instrument.session import session

    env = session().env
    return env.enabled and bool(env.log_dir or env.emit_records)


def _patch_forward(cls: type) -> None:
    original = cls.forward

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(_ATTR)
        if probe is not None and torch.is_grad_enabled():
            probe.on_forward(sync=bool(self.require_backward_grad_sync))
        return original(self, *args, **kwargs)

    cls.forward = forward


def _patch_init(cls: type, attach: Any) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _ATTR not in self.__dict__ and _wanted():  # a subclass's __init__ reaches here once
            attach(self)

    cls.__init__ = __init__


def patch_torch(cls: type) -> None:
    """Patch torch's ``DistributedDataParallel`` (idempotent)."""
    if cls.__dict__.get("_ddp_instrument_patched"):
        return
    register = cls.register_comm_hook

    def attach(self: Any) -> None:
        from ddp.instrument.hook import InstrumentHook
        from ddp.instrument.session import session

        probe = session().attach(self, "torch")
        hook = InstrumentHook(probe.tally, self.process_group)
        register(self, None, hook)
        probe.on_step.append(functools.partial(setattr, hook, "step"))
        self.__dict__["_ddp_instrument_hook"] = hook
        self.__dict__[_ATTR] = probe

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        probe, ours = _probe(self), self.__dict__.get("_ddp_instrument_hook")
        if probe is None or ours is None:
            return register(self, state, hook)
        self._check_comm_hook(hook)
        if ours.user_hook is not None:
            raise RuntimeError(_ONCE)
        ours.use(state, hook)
        if self.logger is not None:
            self.logger._set_comm_hook_name(getattr(hook, "__qualname__", repr(hook)))
        probe.session.hook_registered(probe, hook)
        return None

    builtin = cls._register_builtin_comm_hook

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        if "_ddp_instrument_hook" not in self.__dict__:
            return builtin(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {
            dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
        }
        if comm_hook_type not in hooks:
            raise ValueError(f"unknown built-in comm hook {comm_hook_type}")
        return register_comm_hook(self, self.process_group, hooks[comm_hook_type])

    _patch_init(cls, attach)
    _patch_forward(cls)
    cls.register_comm_hook = register_comm_hook
    cls._register_builtin_comm_hook = _register_builtin_comm_hook
    cls._ddp_instrument_patched = True


def patch_ours(cls: type) -> None:
    """Patch ``ddp.wrapper.DistributedDataParallel`` (idempotent)."""
    if cls.__dict__.get("_ddp_instrument_patched"):
        return

    def attach(self: Any) -> None:
        from ddp.instrument.session import session
        from ddp.instrument.tally import StepTally

        probe = session().attach(self, "ddp")
        if self.flight_recorder is not None:  # the script's own: it keeps seeing everything
            probe.tally = StepTally(self.flight_recorder)
        self.flight_recorder = self.reducer.recorder = probe.tally
        ref = weakref.ref(self)

        def label(step: int) -> None:
            model = ref()
            if model is not None:
                model.reducer.step = step

        probe.on_step.append(label)
        self.__dict__[_ATTR] = probe

    register = cls.register_comm_hook

    @functools.wraps(register)
    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        register(self, state, hook)
        probe = _probe(self)
        if probe is not None:
            probe.session.hook_registered(probe, hook)

    _patch_init(cls, attach)
    _patch_forward(cls)
    cls.register_comm_hook = register_comm_hook
    cls._ddp_instrument_patched = True
