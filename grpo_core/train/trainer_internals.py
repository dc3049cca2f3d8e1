"""A TRL trainer's internals as functions: what the rest of grpo_core reads and sets inside
a trainer, each through one function here. Its step metrics (`log_metric`, `drop_metric`),
its logged rewards (`step_rewards`), its tokenizer (`tokenizer_of`), one generate-score
pass (`generate_and_score`), its sampling (`wrap_generate`), a skipped optimizer step
(`skip_optimizer_step`), TRL's NaN-ignoring std (`reward_std`), the weighted reward total
(`weighted_rewards`), the step's throughput counts and TRL's step time
(`take_step_counts`, `step_time`), the step a batch generated now trains (`batch_step`,
from 1 as the logs count), and the tile of TRL's fused log-prob head (`set_logprob_tile`).

Separate from grpo_core/train/trainer.py, the pipeline's trainers (the mixins that override
TRL's private methods): callbacks, dynamic sampling, the algorithms and the benchmarks need
these functions and not the trainer classes, and the trainers' own hooks use them too, so
they sit below trainer.py. Together the two modules are the one door to TRL's,
transformers' and accelerate's private members (tests/test_trl_contract.py pins each and
scans the project for others); PRIVATE here lists what these functions touch, trainer.py's
PRIVATE what its overrides do."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from accelerate.state import GradientState
from trl import GRPOTrainer, RLOOTrainer
from trl.kernels import chunked_logprob as trl_chunked_logprob
from trl.trainer import utils as trl_utils

from grpo_core.train.throughput import StepCounts

# (owner, member): every private member this module touches. The contract test pins each
# one's signature and the shape relied on (tests/test_trl_contract.py).
PRIVATE = (
    (GRPOTrainer, "_generate_and_score_completions"),  # called (generate_and_score): a dict
    (RLOOTrainer, "_generate_and_score_completions"),
    (GRPOTrainer, "_generate"),  # wrapped (wrap_generate): the sampling of one step
    (GRPOTrainer, "_logs"),  # read: the rewards of the step (step_rewards)
    (GRPOTrainer, "_metrics"),  # {"train"|"eval": defaultdict(list)}, appended to
    (GRPOTrainer, "_tokenizer"),  # the processing class's tokenizer
    (RLOOTrainer, "_generate"),
    (RLOOTrainer, "_logs"),
    (RLOOTrainer, "_metrics"),
    (RLOOTrainer, "_tokenizer"),
    (GradientState, "_set_sync_gradients"),  # False: accelerate skips the optimizer step
    (trl_utils, "nanstd"),  # TRL's advantage std (not exported by trl)
    (trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE"),  # set: vocabulary columns per log-prob tile
    (trl_chunked_logprob, "TOKEN_CHUNK_SIZE"),  # set: positions per log-prob tile
)


# ----------------------------------------------------------------------------- rewards


def weighted_rewards(per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N,) rewards TRL computes advantages from: per_func (N, F) times weights, summed
    over the functions ignoring NaN (a function's "not scored"); NaN where no function
    scored the row (TRL leaves those rows out of its baseline). The one reward total:
    the rollout rows record it with NaN read as 0."""
    per_func = per_func.to(torch.float32)
    total = (per_func * weights.to(per_func).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(per_func).all(dim=1)] = torch.nan
    return total


def reward_std(rewards: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The std TRL scales advantages by (NaN ignored, Bessel-corrected): TRL's own function,
    so a rescaled advantage matches TRL's to the bit."""
    return trl_utils.nanstd(rewards, dim=dim)


# ----------------------------------------------------------------------------- the trainer's internals


def log_metric(trainer, name: str, value: float, mode: str | None = None) -> None:
    """Add `value` to the trainer's metrics of this step (TRL averages and logs them);
    mode: "train" or "eval", by default the model's."""
    trainer._metrics[mode or _mode(trainer)][name].append(float(value))


def drop_metric(trainer, name: str, mode: str | None = None) -> None:
    trainer._metrics[mode or _mode(trainer)].pop(name, None)


def step_time(trainer) -> float | None:
    """TRL's `step_time` of the optimizer step that just ended (GRPOTrainer.training_step
    appends it after the step's last micro-batch); None when it logged none."""
    times = trainer._metrics["train"].get("step_time")
    return times[-1] if times else None


def take_step_counts(trainer) -> StepCounts:
    """The throughput counts (MeasuresThroughput) since the last call, reset."""
    counts = trainer.__dict__.get("step_counts") or StepCounts()
    trainer.step_counts = StepCounts()
    return counts


def _mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


def batch_step(trainer) -> int:
    """The step number a batch generated now trains: the optimizer step about to run,
    counted from 1 as the Trainer's logs and checkpoints count (global_step counts the
    steps done). The `rollouts` table records it, so its steps are the logs' steps."""
    return trainer.state.global_step + 1


def tokenizer_of(trainer):
    """The tokenizer TRL decodes with (the processing class's, for a processor)."""
    return trainer._tokenizer


def step_rewards(trainer, n: int) -> tuple[dict[str, list[float]], torch.Tensor]:
    """The last generate-score call's per-function rewards ({name: the last n values} in
    TRL's order: its logs hold every process's rows) and their (n,) weighted totals."""
    rewards = {name: list(vals)[-n:] for name, vals in trainer._logs["rewards"].items()}
    per_func = torch.tensor(list(rewards.values()), dtype=torch.float32).T
    return rewards, weighted_rewards(per_func, trainer.reward_weights.cpu())


def generate_and_score(trainer, inputs: list[dict]) -> dict:
    """One TRL generate-score-advantage call on `inputs` (the pipeline's hooks included)."""
    return trainer._generate_and_score_completions(inputs)


def wrap_generate(trainer, wrap: Callable) -> None:
    """Replace the trainer's generation (sampling alone, no scoring or update: what
    benchmarks time) by wrap(the original)."""
    trainer._generate = wrap(trainer._generate)


def skip_optimizer_step(trainer) -> None:
    """From on_pre_optimizer_step: with the gradients not synced, accelerate's optimizer
    (and scaler, and scheduler) skip their step; the Trainer then zeroes the gradients.
    The Trainer sets it again before each micro-batch."""
    trainer.accelerator.gradient_state._set_sync_gradients(False)


def logprob_tile() -> tuple[int, int]:
    """(positions, vocabulary columns) per tile of TRL's fused LM head as now set."""
    return trl_chunked_logprob.TOKEN_CHUNK_SIZE, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE


def set_logprob_tile(tokens: int, vocab: int) -> None:
    """Tile of TRL's fused LM head (trl/trainer/utils.py add_fused_lm_head): it projects
    `tokens` positions x `vocab` columns at a time into running log-sum-exp statistics,
    never the whole batch x sequence x vocabulary. TRL's 4096 x 32768 suits its Triton
    kernel; its torch fallback (CPU) keeps ~33 bytes per tile element in backward, 4.4 GB
    at that size. Both are module globals read at call time (pinned in
    tests/test_trl_contract.py); the setting is per process, as the trainer is."""
    trl_chunked_logprob.TOKEN_CHUNK_SIZE = int(tokens)
    trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = int(vocab)


@contextlib.contextmanager
def configured_logprob_tile(cfg) -> Iterator[None]:
    """cfg's tile (grpo_core.modeling.memory_plan.logprob_tile, on this device) for one
    trainer's work, the tile before restored on exit. The tile changes the order of the
    head's float sums (the weights differ in the last bits), so each training stage sets
    its own and none leaves it to the next stage of the process (an SFT after another
    recipe's GRPO round trained at that round's tile)."""
    from grpo_core.modeling.memory_plan import logprob_tile as configured

    before = logprob_tile()
    set_logprob_tile(*configured(cfg, cpu=not torch.cuda.is_available()))
    try:
        yield
    finally:
        set_logprob_tile(*before)
