"""The flow's warm-engine slot (grpo_core/generation/warm_engine.py): one engine kept for
the next stage on the same model, stopped when another is asked for, before training and at
the block's end. The vLLM engine itself: tests/test_vllm_cpu.py (make test-vllm); here the
slot's rules, with a plain object standing in for an engine (only its shutdown() matters), and
the hf backend, which the slot leaves to its stage."""
from __future__ import annotations

import pytest

from grpo_core.generation.warm_engine import keep_warm, release_warm, warm_slot


class Engine:
    def __init__(self, name):
        self.name, self.stopped = name, 0

    def shutdown(self):
        self.stopped += 1


def test_the_same_key_takes_the_parked_engine_another_stops_it_first():
    made = []
    make = lambda name: lambda: made.append(Engine(name)) or made[-1]  # noqa: E731
    with keep_warm() as warm:
        a = warm.take(("m1", 1), make("a"))
        assert warm.take(("m1", 1), make("a2")) is a and len(made) == 1
        b = warm.take(("m1", 2), make("b"))  # other settings: a new engine, the old one stopped
        assert a.stopped == 1 and b.stopped == 0
        assert release_warm() and b.stopped == 1
        assert not release_warm()  # nothing parked
        c = warm.take(("m2", 1), make("c"))
    assert c.stopped == 1  # leaving the block stops it
    assert (warm.starts, warm.reuses) == (3, 1)
    assert warm_slot() is None and not release_warm()


def test_an_exception_in_the_block_still_stops_the_engine():
    with pytest.raises(RuntimeError), keep_warm() as warm:
        e = warm.take("k", lambda: Engine("e"))
        raise RuntimeError("a stage failed")
    assert e.stopped == 1


def test_disabled_means_no_slot():
    with keep_warm(enabled=False):
        assert warm_slot() is None


def test_the_hf_backend_stays_the_stages_own(tmp_path):
    """rollout.backend hf inside the block: released at its stage's end as before, the slot
    untouched (nothing the main job runs changes)."""
    from grpo_core.config import config_from_dict
    from grpo_core.generation.rollout import HFBackend
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.gpu import stage_memory
    from grpo_core.modeling.loading import resolve_model_path

    path = resolve_model_path("builtin:tiny-arith", tmp_path)
    cfg = config_from_dict({"project": {"workdir": str(tmp_path)}, "rollout": {"backend": "hf"}})
    with keep_warm() as warm, stage_memory() as stage:
        backend, _ = build_backend(path, cfg)
        assert isinstance(backend, HFBackend)
    assert stage.released == 1 and warm.starts == 0
