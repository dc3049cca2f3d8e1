"""The contract with TRL's, transformers' and accelerate's private members.

grpo_core/train/trainer.py (the trainers' overrides) and grpo_core/train/trainer_internals.py
(the functions the rest of grpo_core uses) are the only modules that touch them (the door),
and each lists those it touches in its PRIVATE. Each is pinned here against the installed
versions: that it exists, its parameters, and the shape the door relies on (read from the
installed source, so nothing is trained). An upgrade that moves one fails the test named
after it, saying what moved, instead of changing a number somewhere in a round. A second test scans the project for
any other module reaching for one of those names."""
from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import torch

from grpo_core.train import trainer, trainer_internals

ROOT = Path(__file__).resolve().parent.parent
DOOR = {ROOT / "grpo_core" / "train" / f"{m}.py" for m in ("trainer", "trainer_internals")}
PRIVATE = trainer.PRIVATE + trainer_internals.PRIVATE  # the door's, both modules
SCANNED = ("grpo_core", "tasks", "flows", "bench")

# The keys of the scored batch that the door, the algorithms and dynamic sampling read.
SCORED_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
LOG_KEYS = ("prompt", "completion", "rewards", "advantages")


def _label(owner, name: str) -> str:
    return f"{owner.__name__}.{name}"


def _function_ast(fn) -> ast.FunctionDef:
    return ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]


def _member(owner, name: str):
    assert hasattr(owner, name), (
        f"{_label(owner, name)} is gone from the installed {owner.__module__} "
        "(renamed or removed): the door (grpo_core/train/trainer.py, trainer_internals.py) "
        "relies on it")
    return getattr(owner, name)


def _params(owner, name: str, want: list[str]):
    fn = _member(owner, name)
    got = list(inspect.signature(fn).parameters)
    assert got == want, f"{_label(owner, name)} parameters moved: expected {want}, installed {got}"
    return fn


def _returns(owner, name: str) -> list[ast.expr]:
    fn = _function_ast(_member(owner, name))
    nested = {id(n) for f in ast.walk(fn) if f is not fn and isinstance(f, ast.FunctionDef)
              for n in ast.walk(f)}
    return [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and id(n) not in nested
            and n.value is not None]


def _init_assignment(owner, name: str) -> ast.expr:
    """The value `owner.__init__` assigns to self.<name>: the instance attribute exists."""
    for node in ast.walk(_function_ast(owner.__init__)):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and t.attr == name and \
                        isinstance(t.value, ast.Name) and t.value.id == "self":
                    return node.value
    raise AssertionError(f"{_label(owner, name)}: {owner.__name__}.__init__ no longer sets "
                         f"self.{name} (renamed or removed): the door reads it")


def _dict_keys(node: ast.expr) -> dict[str, ast.expr]:
    assert isinstance(node, ast.Dict)
    return {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}


# ----------------------------------------------------------------------------- the pins


def _pin_generate_single_turn(owner):
    if owner.__name__ == "GRPOTrainer":
        _params(owner, "_generate_single_turn", ["self", "prompt_ids", "images",
                                                 "multimodal_fields", "num_generations",
                                                 "has_tool_images"])
        for r in _returns(owner, "_generate_single_turn"):
            assert isinstance(r, ast.Tuple) and len(r.elts) == 2, (
                f"{_label(owner, '_generate_single_turn')} no longer returns (completion_ids, "
                f"logprobs): returns {ast.unparse(r)}")
    else:
        _params(owner, "_generate_single_turn", ["self", "prompt_ids", "images", "multimodal_fields"])
        for r in _returns(owner, "_generate_single_turn"):
            assert not isinstance(r, ast.Tuple), (
                f"{_label(owner, '_generate_single_turn')} no longer returns the completion ids "
                f"alone: returns {ast.unparse(r)}")


def _pin_generate_and_score(owner):
    fn = _params(owner, "_generate_and_score_completions", ["self", "inputs"])
    strings = {n.value for n in ast.walk(_function_ast(fn)) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    missing = [k for k in SCORED_KEYS if k not in strings]
    assert not missing, (f"{_label(owner, '_generate_and_score_completions')}'s scored batch "
                         f"lacks {missing}")
    returns = _returns(owner, "_generate_and_score_completions")
    assert returns and all(isinstance(r, (ast.Name, ast.Dict)) for r in returns), (
        f"{_label(owner, '_generate_and_score_completions')} no longer returns one dict: "
        f"{[ast.unparse(r) for r in returns]}")


def _pin_logs(owner):
    value = _init_assignment(owner, "_logs")
    keys = _dict_keys(value) if isinstance(value, ast.Dict) else {}
    missing = [k for k in LOG_KEYS if k not in keys]
    assert not missing, f"{_label(owner, '_logs')} lacks the keys {missing}: {ast.unparse(value)}"
    rewards = ast.unparse(keys["rewards"])
    assert rewards.startswith("defaultdict("), (
        f"{_label(owner, '_logs')}['rewards'] is no longer a defaultdict per reward name: {rewards}")
    assert "self._logs['rewards'][name]" in ast.unparse(_function_ast(
        owner._generate_and_score_completions)), (
        f"{_label(owner, '_logs')}['rewards'] is no longer filled per reward name")


def _pin_metrics(owner):
    value = _init_assignment(owner, "_metrics")
    text = ast.unparse(value)
    assert text == "{'train': defaultdict(list), 'eval': defaultdict(list)}", (
        f"{_label(owner, '_metrics')} is no longer {{'train'|'eval': defaultdict(list)}}: {text}")
    # grpo_core.train.trainer_internals.step_time: one step_time per optimizer step, appended by
    # training_step before the step ends (throughput/train_seconds = step_time - generation)
    assert "self._metrics['train']['step_time'].append(" in ast.unparse(
        _function_ast(owner.training_step)), (
        f"{owner.__name__}.training_step no longer appends _metrics['train']['step_time']")


def _pin_tokenizer(owner):
    _init_assignment(owner, "_tokenizer")


def _pin_nanstd(owner):
    _params(owner, "nanstd", ["tensor", "dim", "keepdim"])
    x = torch.tensor([1.0, 3.0, float("nan")])
    got = float(owner.nanstd(x))
    assert abs(got - 2 ** 0.5) < 1e-6, f"trl.trainer.utils.nanstd is no longer the NaN-ignoring " \
                                       f"Bessel-corrected std: std(1, 3, nan) = {got}"


def _called_in_generate_and_score(owner, name: str) -> None:
    """`name` exists and `_generate_and_score_completions` calls it (the door times it there:
    throughput/score_seconds, throughput/logprob_seconds); it takes what it is given."""
    _member(owner, name)
    assert f"self.{name}(" in ast.unparse(_function_ast(owner._generate_and_score_completions)), (
        f"{_label(owner, '_generate_and_score_completions')} no longer calls {name}: the "
        "step's time split (grpo_core/train/trainer.py MeasuresThroughput) would miss it")


def _pin_calculate_rewards(owner):
    _params(owner, "_calculate_rewards", ["self", "inputs", "prompts", "completions",
                                          "completion_ids_list"])
    _called_in_generate_and_score(owner, "_calculate_rewards")


def _global_read_in(fn, name: str) -> bool:
    """Whether `fn`'s body reads the module global `name` (so setting it takes effect at
    the next call, not at import)."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               for n in ast.walk(_function_ast(fn)))


def _pin_vocab_tile(owner):
    """An int that add_fused_lm_head reads when the fused forward runs (its nested
    function passes it as the chunk size of ChunkedLogProbFunction)."""
    value = _member(owner, "_CHUNKED_LOGPROB_CHUNK_SIZE")
    assert isinstance(value, int), f"trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE is {value!r}, not an int"
    assert _global_read_in(owner.add_fused_lm_head, "_CHUNKED_LOGPROB_CHUNK_SIZE"), \
        "trl_utils.add_fused_lm_head no longer reads _CHUNKED_LOGPROB_CHUNK_SIZE at call time"


def _pin_token_tile(owner):
    """An int that ChunkedLogProbFunction's forward and backward read at call time."""
    value = _member(owner, "TOKEN_CHUNK_SIZE")
    assert isinstance(value, int), f"chunked_logprob.TOKEN_CHUNK_SIZE is {value!r}, not an int"
    fn = owner.ChunkedLogProbFunction
    for step in ("forward", "backward"):
        assert _global_read_in(getattr(fn, step), "TOKEN_CHUNK_SIZE"), \
            f"ChunkedLogProbFunction.{step} no longer reads TOKEN_CHUNK_SIZE at call time"


def _trainer_pins():
    from accelerate.state import GradientState
    from transformers import Trainer
    from trl import GRPOTrainer, RLOOTrainer
    from trl.kernels import chunked_logprob as trl_chunked_logprob
    from trl.trainer import utils as trl_utils

    pins = {}
    for owner in (GRPOTrainer, RLOOTrainer):
        pins[(owner, "_generate_single_turn")] = _pin_generate_single_turn
        pins[(owner, "_generate_and_score_completions")] = _pin_generate_and_score
        pins[(owner, "_logs")] = _pin_logs
        pins[(owner, "_metrics")] = _pin_metrics
        pins[(owner, "_tokenizer")] = _pin_tokenizer
        pins[(owner, "_generate")] = lambda o: _params(o, "_generate", ["self", "prompts"])
        pins[(owner, "_calculate_rewards")] = _pin_calculate_rewards
        pins[(owner, "_get_per_token_logps_and_entropies")] = lambda o: \
            _called_in_generate_and_score(o, "_get_per_token_logps_and_entropies")
    pins[(GRPOTrainer, "_compute_loss")] = lambda o: _params(o, "_compute_loss",
                                                             ["self", "model", "inputs"])
    pins[(Trainer, "_save")] = lambda o: _params(o, "_save", ["self", "output_dir", "state_dict"])
    pins[(Trainer, "_clip_grad_norm")] = lambda o: _params(o, "_clip_grad_norm", ["self", "model"])
    pins[(Trainer, "_save_checkpoint")] = lambda o: _params(o, "_save_checkpoint",
                                                            ["self", "model", "trial"])
    pins[(Trainer, "_get_output_dir")] = lambda o: _params(o, "_get_output_dir", ["self", "trial"])
    pins[(Trainer, "_load_optimizer_and_scheduler")] = lambda o: _params(
        o, "_load_optimizer_and_scheduler", ["self", "checkpoint"])
    pins[(GradientState, "_set_sync_gradients")] = lambda o: _params(
        o, "_set_sync_gradients", ["self", "sync_gradients"])
    pins[(trl_utils, "nanstd")] = _pin_nanstd
    pins[(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE")] = _pin_vocab_tile
    pins[(trl_chunked_logprob, "TOKEN_CHUNK_SIZE")] = _pin_token_tile
    return pins


PINS = _trainer_pins()


def _id(key) -> str:
    owner, name = key
    return (f"{getattr(owner, '__name__', owner)}.{name}".replace("trl.trainer.utils", "trl_utils")
            .replace("trl.kernels.chunked_logprob", "trl_chunked_logprob"))


def check(owner, name: str) -> None:
    PINS[(owner, name)](owner)


def test_every_private_member_the_door_uses_is_pinned():
    assert {_id(k) for k in PRIVATE} == {_id(k) for k in PINS}


@pytest.mark.parametrize("key", list(PINS), ids=[_id(k) for k in PINS])
def test_pinned_member_matches_the_installed_version(key):
    check(*key)


def test_a_renamed_member_fails_naming_it(monkeypatch):
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn
    monkeypatch.delattr(GRPOTrainer, "_generate_single_turn")
    monkeypatch.setattr(GRPOTrainer, "_generate_one_turn", original, raising=False)
    with pytest.raises(AssertionError, match=r"GRPOTrainer\._generate_single_turn is gone"):
        check(GRPOTrainer, "_generate_single_turn")


def test_a_moved_parameter_fails_naming_the_member(monkeypatch):
    from transformers import Trainer

    def _save(self, output_dir=None, state_dict=None, safe_serialization=True):
        pass

    monkeypatch.setattr(Trainer, "_save", _save)
    with pytest.raises(AssertionError, match=r"Trainer\._save parameters moved"):
        check(Trainer, "_save")


# ----------------------------------------------------------------------------- the scan


def _outside_the_door() -> list[str]:
    # and datasets' Dataset._fingerprint (grpo_core.data.hub reads the builder's public hash)
    names = {name for _, name in PRIVATE} | {"_fingerprint"}
    found = []
    for pkg in SCANNED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path in DOOR:
                continue
            tree = ast.parse(path.read_text(), str(path))
            where = path.relative_to(ROOT)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in names:
                    found.append(f"{where}:{node.lineno}: .{node.attr}")
                elif isinstance(node, ast.ClassDef):  # an override of a pinned method
                    found += [f"{where}:{m.lineno}: {node.name}.{m.name}" for m in node.body
                              if isinstance(m, ast.FunctionDef) and m.name in names]
                elif isinstance(node, ast.ImportFrom) and node.module == "trl.trainer.utils":
                    found.append(f"{where}:{node.lineno}: from trl.trainer.utils import ...")
    return found


def test_no_module_but_the_door_touches_a_pinned_private():
    assert _outside_the_door() == [], "use grpo_core.train.trainer_internals' functions instead"
