"""One vLLM engine for consecutive stages on the same model.

    with keep_warm(cfg.rollout.reuse_engine) as warm:   # the flow, around its stages
        eval/sft:       build_backend(sft_model) -> an engine starts, parked in the slot
        filter/round-1: build_backend(sft_model) -> the parked engine, no start
        release_warm()                            # before a training stage
        ...
    warm.starts, warm.reuses                      # what it did

An engine start costs 40-100 s on a CPU (docs/vllm-cpu.md: imports, the profile run, the KV
cache), more than a small eval or filter spends generating; the pipeline asks for the same
model twice in a row at each round boundary (eval/sft then filter/round-1, eval/round-N then
filter/round-N+1, eval/base then filter/round-1 without SFT). The slot holds one engine:
asking for another model, or the same one with other engine settings, stops the parked one
before the new one starts, and so does `release_warm()`, which the flow calls before a
training stage (the trainer, or TRL's own colocated engine, needs that memory). Leaving the
block stops it. Outside a block, or disabled, each stage starts and stops its own engine
(grpo_core.modeling.gpu.stage_memory). Results do not depend on it: every filter and eval
request carries its own seed, and greedy is greedy (tests/test_vllm_cpu.py compares).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from grpo_core.modeling.gpu import release


@dataclass
class WarmSlot:
    """The parked engine, its key, and how often one was started or taken again."""

    starts: int = 0
    reuses: int = 0
    _key: Hashable | None = field(default=None, repr=False)
    _backend: Any = field(default=None, repr=False)

    def take(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The parked backend when its key is `key`; else the parked one stopped and
        `make()`'s parked in its place."""
        if self._backend is not None and self._key == key:
            self.reuses += 1
            return self._backend
        self.release()
        self._backend, self._key = make(), key
        self.starts += 1
        return self._backend

    def release(self) -> bool:
        """Stop the parked engine, if any; True when one was stopped."""
        backend, self._backend, self._key = self._backend, None, None
        return backend is not None and release(backend)


_SLOT: contextvars.ContextVar[WarmSlot | None] = contextvars.ContextVar(
    "grpo_warm_engine", default=None)


@contextlib.contextmanager
def keep_warm(enabled: bool = True) -> Iterator[WarmSlot]:
    """A slot for one engine across the stages inside (module doc); stopped on leaving,
    even by an exception. Disabled: a slot that counts nothing, and every stage starts its own."""
    slot = WarmSlot()
    token = _SLOT.set(slot if enabled else None)
    try:
        yield slot
    finally:
        _SLOT.reset(token)
        slot.release()


def warm_slot() -> WarmSlot | None:
    """The innermost keep_warm block's slot, None outside one (or disabled)."""
    return _SLOT.get()


def release_warm() -> bool:
    """Stop the parked engine before a stage that needs its memory; True when one was."""
    slot = _SLOT.get()
    return slot.release() if slot is not None else False
