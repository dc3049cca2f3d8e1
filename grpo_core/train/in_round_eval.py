"""In-round evaluation (in_round_eval.every): the policy is scored every N optimizer steps on a
small held-out slice of the pool, and the round's model is its best checkpoint by that
score, not the last (a round that overshoots keeps what it had learnt).

- `split_held_out`: the slice, fixed by the seed and the problems' content, never trained on;
- `BestTracker`: which evaluation is best, and the early stop after `patience` evaluations
  in a row below it (pure: the test drives it with constructed scores);
- `InRoundEvaluator`: greedy generation + strict accuracy, the metric eval reports as
  `greedy_accuracy`, under a protocol hash built like eval's;
- `grpo_core.train.callbacks.InRoundEval`: the TrainerCallback that runs it, saves each new
  best model to <round>/best (in the checkpoint's stored dtype, tokenizer included) and logs
  `in_round_eval/accuracy` into TRL's per-step metrics (history, MLflow).

Selecting on training-pool problems, not the benchmark, keeps the benchmark numbers honest:
a checkpoint chosen on the test split would be tuned to it."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.data.problems import Problem

BEST_DIR = "best"
STATE_FILE = "in_round_eval.json"  # in BEST_DIR: the tracker, for a resumed round
METRIC = "in_round_eval/accuracy"


def split_held_out(problems: list[Problem], n: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(to train on, held out): the n problems whose seeded content hash is smallest, so
    the slice does not depend on the pool's order and stays put as the pool shrinks."""
    if n >= len(problems):
        raise ValueError(f"in_round_eval.problems = {n} leaves nothing to train on in a pool of "
                         f"{len(problems)} problems: lower in_round_eval.problems or unset in_round_eval.every")

    def rank(p: Problem) -> str:
        return hashlib.sha256(f"{seed}:{p.fingerprint}".encode()).hexdigest()

    held = {id(p) for p in sorted(problems, key=rank)[:n]}
    return [p for p in problems if id(p) not in held], [p for p in problems if id(p) in held]


@dataclass
class BestTracker:
    """Best-so-far over the round's evaluations; `patience` evaluations in a row below the
    best stop the round (None: never). Ties keep the earlier step (fewer updates)."""

    patience: int | None = None
    best_step: int | None = None
    best_score: float = float("-inf")
    below: int = 0  # evaluations in a row below the best
    scores: list[tuple[int, float]] = field(default_factory=list)

    def observe(self, step: int, score: float) -> tuple[bool, bool]:
        """(is this the new best?, should the round stop?)"""
        self.scores.append((step, score))
        if score > self.best_score:
            self.best_step, self.best_score, self.below = step, score, 0
            return True, False
        self.below += 1
        return False, self.patience is not None and self.below >= self.patience

    def to_json(self) -> dict:
        return {"best_step": self.best_step, "best_score": self.best_score, "below": self.below,
                "scores": self.scores}

    @classmethod
    def from_json(cls, data: dict, patience: int | None) -> BestTracker:
        return cls(patience, data["best_step"], float(data["best_score"]), int(data["below"]),
                   [(int(s), float(v)) for s, v in data["scores"]])

    def choice(self, last_step: int) -> str:
        """The report's line: which checkpoint the round hands on, and why."""
        last = dict(self.scores).get(last_step)
        shown = ", ".join(f"{s}: {v:.3f}" for s, v in self.scores)
        if self.best_step == last_step or last is None and self.best_step is None:
            return f"in-round eval ({shown}): the last step {last_step} is the best"
        tail = f"over the last step {last_step} ({last:.3f})" if last is not None else \
            f"over the last step {last_step} (not evaluated)"
        return (f"in-round eval ({shown}): chose step {self.best_step} "
                f"({self.best_score:.3f}) {tail}")


class InRoundEvaluator:
    """Greedy strict accuracy of the live policy on the held-out slice, with eval's answer
    checking (grpo_core.eval.evaluation) and generation (HFBackend, the template's stop)."""

    def __init__(self, problems: list[Problem], template: str, max_new_tokens: int, cfg):
        from grpo_core.eval.evaluation import protocol_for, protocol_hash

        self.problems, self.template, self.max_new_tokens = problems, template, max_new_tokens
        proto = protocol_for(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={
            "greedy": True, "samples": 1, "max_new_tokens": max_new_tokens})}),
            "in-round", template, problems)
        self.protocol_hash = protocol_hash(proto)

    def __call__(self, model, tokenizer) -> float:
        import torch

        from grpo_core.eval.evaluation import score_greedy
        from grpo_core.generation.rollout import HFBackend
        from grpo_core.prompts import stop_strings

        was_training = model.training
        # generate() draws nothing when greedy, but HFBackend seeds the global generator:
        # put it back, so the round's own sampling does not depend on eval_every.
        cpu = torch.random.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            backend = HFBackend(model, tokenizer, stop_strings=stop_strings(self.template))
            return score_greedy(backend, tokenizer, self.problems, self.template, self.max_new_tokens)
        finally:
            torch.random.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
            model.train(was_training)


def load_tracker(out: Path, patience: int | None) -> BestTracker:
    """The tracker a resumed round continues (a fresh one when nothing was evaluated)."""
    path = out / BEST_DIR / STATE_FILE
    if path.is_file():
        return BestTracker.from_json(json.loads(path.read_text()), patience)
    return BestTracker(patience)
