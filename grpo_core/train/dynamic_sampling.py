"""DAPO's dynamic sampling inside TRL's GRPO step (dynamic_sampling), which TRL lacks.

A group (the G completions of one prompt) whose rewards are all equal has zero advantage:
it adds the KL term and nothing else to the step. With dynamic sampling, such groups are
dropped from the optimizer step's batch and replaced by the groups of fresh prompts drawn
from the training set, one generation pass after another, until the batch holds only
informative groups or max_regenerations passes were made; then the step trains on what it
has, the first pass's uninformative groups filling the rest, so its size never changes.

How it sits in TRL 1.16: `_prepare_inputs` calls `_generate_and_score_completions` once
per generation batch (one optimizer step here: steps_per_generation = GA) and splits the
returned dict into accumulation slices. PipelineGRPOTrainer hands that call to
`DynamicSampler.fill`, which calls the trainer's own method back once per pass (each pass
is a full TRL generate-score-advantage call on its prompts), picks groups, and splices the
passes' dicts into one of the original size.

- Advantages are TRL's. Under scale_rewards "group" and "none" a group's advantages depend
  on that group alone, so splicing keeps them exact. Under "batch" TRL divides by the std
  of the whole generation batch; the spliced batch's advantages are rescaled to its own
  std (what TRL computes had it generated that batch at once). multi_objective_aggregation
  "normalize_then_sum" (batch-normalised after the sum) is refused.
- The rollout sink gets every generated completion, dropped groups included, once per
  step, in generation order; each row has `trained` (in the optimizer step or not) and the
  advantage it was trained with (its pass's for dropped rows).
- skip_update_below applies to the trained batch, not to each pass.
- TRL's own step metrics (reward, frac_reward_zero_std, completion lengths, num_tokens)
  average over every pass, so they describe what was generated; dynamic_sampling/* are
  what this adds (informative_share is of the trained batch).
- One process only (refused at round start otherwise): a pass is a collective under
  accelerate, and the ranks would have to agree on every regeneration.
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from grpo_core.train.trainer_internals import (
    batch_step,
    generate_and_score,
    log_metric,
    reward_std,
    step_rewards,
    tokenizer_of,
)

# TRL 1.16 divides advantages by std + 1e-4 (not exposed; see config.GRPOConfig.scale_rewards).
TRL_ADVANTAGE_EPS = 1e-4
# Rewards closer than this count as equal (a group of them is uninformative).
EQUAL_REWARD_TOL = 1e-6

METRICS = ("dynamic_sampling/groups_dropped", "dynamic_sampling/completions_generated",
           "dynamic_sampling/informative_share", "dynamic_sampling/passes")

# The keys of TRL's scored batch, by how they are padded: along the prompt (left-padded),
# along the completion (right-padded), one value per row, or re-derived after splicing.
PROMPT_KEYS = {"prompt_ids": "pad", "prompt_mask": 0}
COMPLETION_KEYS = {"completion_ids": "pad", "completion_mask": 0, "tool_mask": 1,
                   "old_per_token_logps": 0.0, "ref_per_token_logps": 0.0,
                   "sampling_per_token_logps": 0.0, "importance_sampling_ratio": 1.0}
ROW_KEYS = ("advantages", "vhead_features", "vhead_target")  # the last two: grpo_vhead's head inputs
DERIVED_KEYS = ("num_items_in_batch",)


# ----------------------------------------------------------------------------- pure helpers


def informative_groups(rewards: torch.Tensor | Sequence[float], num_generations: int,
                       tol: float = EQUAL_REWARD_TOL) -> list[bool]:
    """Per group of num_generations consecutive rows: whether its rewards differ (by more
    than tol). A group with fewer than two scored (non-NaN) rewards is uninformative."""
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if r.numel() % num_generations:
        raise ValueError(f"{r.numel()} rewards do not make whole groups of {num_generations}")
    out = []
    for group in r.view(-1, num_generations):
        scored = group[~torch.isnan(group)]
        out.append(scored.numel() >= 2 and float(scored.max() - scored.min()) > tol)
    return out


def pick_groups(informative: Sequence[Sequence[bool]], n_groups: int) -> list[tuple[int, int]]:
    """(pass, group) of the n_groups groups a step trains on: informative groups in the
    order they were generated; when too few, the first pass's others fill the batch."""
    good = [(p, g) for p, flags in enumerate(informative) for g, ok in enumerate(flags) if ok]
    if len(good) >= n_groups:
        return good[:n_groups]
    fill = [(0, g) for g, ok in enumerate(informative[0]) if not ok]
    fill += [(p, g) for p, flags in enumerate(informative[1:], 1) for g, ok in enumerate(flags) if not ok]
    return good + fill[:n_groups - len(good)]


def _pad(t: torch.Tensor, width: int, side: str, value) -> torch.Tensor:
    extra = width - t.size(1)
    if extra <= 0:
        return t
    block = torch.full((t.size(0), extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([block, t] if side == "left" else [t, block], dim=1)


def splice(parts: Sequence[dict], picks: Sequence[tuple[int, int]], num_generations: int,
           pad_token_id: int) -> dict:
    """One TRL scored batch from the groups `picks` ((part, group) pairs, in order) of
    several: prompts left-padded and completions right-padded to the widest part, as TRL
    pads them (pad token for ids, 0 for masks and log-probs, 1 for tool masks and
    importance ratios); num_items_in_batch recounted over the spliced loss mask (one
    process). Keys it does not know (multimodal ones) raise ValueError."""
    known = set(PROMPT_KEYS) | set(COMPLETION_KEYS) | set(ROW_KEYS) | set(DERIVED_KEYS)
    keys = list(parts[0])
    unknown = sorted(set().union(*parts) - known)
    if unknown:
        raise ValueError(f"dynamic sampling cannot splice TRL batch keys {unknown} "
                         "(multimodal or tool inputs); disable dynamic_sampling")
    if any(set(p) != set(keys) for p in parts):
        raise ValueError("dynamic sampling: the passes' TRL batches have different keys")
    used = sorted({p for p, _ in picks})
    prompt_w = max(parts[p]["prompt_ids"].size(1) for p in used)
    completion_w = max(parts[p]["completion_ids"].size(1) for p in used)
    # sequence-level importance ratios are (B, 1) in every part: nothing to pad
    seq_ratio = "importance_sampling_ratio" in keys and all(
        parts[p]["importance_sampling_ratio"].size(1) == 1 for p in used)
    out = {}
    for key in keys:
        if key in DERIVED_KEYS:
            continue
        chunks = []
        for p, g in picks:
            t = parts[p][key][g * num_generations:(g + 1) * num_generations]
            if key in PROMPT_KEYS:
                value = pad_token_id if PROMPT_KEYS[key] == "pad" else PROMPT_KEYS[key]
                t = _pad(t, prompt_w, "left", value)
            elif key in COMPLETION_KEYS and not (key == "importance_sampling_ratio" and seq_ratio):
                value = pad_token_id if COMPLETION_KEYS[key] == "pad" else COMPLETION_KEYS[key]
                t = _pad(t, completion_w, "right", value)
            chunks.append(t)
        out[key] = torch.cat(chunks, dim=0)
    if "num_items_in_batch" in keys:
        mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        out["num_items_in_batch"] = mask.sum()
    return {k: out[k] for k in keys}  # TRL's key order


def rescale_batch_advantages(advantages: torch.Tensor, pass_std: torch.Tensor,
                             batch_std: float) -> torch.Tensor:
    """scale_rewards="batch": TRL's (r - group mean) / (std of its pass + eps), re-divided
    by the std of the batch it is trained in. pass_std: (B,) the std each row's pass had."""
    return advantages * (pass_std + TRL_ADVANTAGE_EPS) / (batch_std + TRL_ADVANTAGE_EPS)


def _prompt_key(row: dict) -> str:
    return str(row["prompt"])  # a conversational prompt (list of messages) is not hashable


def fresh_rows(dataset, seed: int, step: int, exclude: set[str]) -> Iterator[dict]:
    """Training rows for refill passes: a permutation of `dataset` seeded by (seed, step),
    so a resumed round draws what the killed one would have. Prompts in `exclude` (this
    step's so far) come last: a pool smaller than a step's draws repeats, never stalls."""
    order = list(range(len(dataset)))
    random.Random(f"dynamic-sampling:{seed}:{step}").shuffle(order)
    later = []
    for i in order:
        row = dataset[i]
        if _prompt_key(row) in exclude:
            later.append(i)
            continue
        exclude.add(_prompt_key(row))
        yield dict(row)
    while True:
        for i in later or order:
            yield dict(dataset[i])


# ----------------------------------------------------------------------------- the sampler


@dataclass
class _Pass:
    out: dict  # TRL's scored batch
    rewards: torch.Tensor  # (B,) weighted rewards, NaN where unscorable
    informative: list[bool]  # per group


class DynamicSampler:
    """Fills each optimizer step's batch with informative groups (see the module doc).
    PipelineGRPOTrainer (grpo_core.train.trainer) hands its generate-score call to `fill` and is
    called back once per pass (`in_pass` tells it which)."""

    def __init__(self, dataset, max_regenerations: int, seed: int):
        self.dataset, self.max_regenerations, self.seed = dataset, max_regenerations, seed
        self.in_pass = False

    def fill(self, trainer, inputs: list[dict]) -> dict:
        G = trainer.num_generations
        n_groups = len(inputs) // G
        step = trainer.state.global_step
        sink, skip_below = trainer.rollout_sink, trainer.skip_update_below
        rows: list[dict] = []
        if sink is not None:  # collect the passes' rows; the sink gets them once, below
            trainer.rollout_sink = lambda _step, batch: rows.extend(batch)
        trainer.skip_update_below = None  # judged on the trained batch, below
        self.in_pass = True
        try:
            passes = [self._pass(trainer, inputs)]
            fresh = fresh_rows(self.dataset, self.seed, step, {_prompt_key(x) for x in inputs})
            for _ in range(self.max_regenerations):
                missing = n_groups - sum(sum(p.informative) for p in passes)
                if missing <= 0:
                    break
                prompts = [next(fresh) for _ in range(missing)]
                # as TRL's RepeatSampler: each prompt num_generations times in a row
                passes.append(self._pass(trainer, [dict(x) for x in prompts for _ in range(G)]))
        finally:
            self.in_pass = False
            trainer.rollout_sink, trainer.skip_update_below = sink, skip_below

        picks = pick_groups([p.informative for p in passes], n_groups)
        if picks == [(0, g) for g in range(n_groups)]:
            out = passes[0].out  # the first pass as TRL returned it
        else:
            out = splice([p.out for p in passes], picks, G, tokenizer_of(trainer).pad_token_id)
            if trainer.scale_rewards == "batch":
                out["advantages"] = self._batch_scaled(passes, picks, G, out["advantages"])
        trained = torch.cat([passes[p].rewards[g * G:(g + 1) * G] for p, g in picks])
        if skip_below is not None and float(torch.nan_to_num(trained, nan=0.0).max()) < skip_below:
            out["advantages"] = out["advantages"] * 0.0  # as PipelineGRPOTrainer does per batch
            trainer.skip_steps_left = trainer.num_iterations

        informative = sum(passes[p].informative[g] for p, g in picks)
        generated = sum(len(p.informative) for p in passes)
        for key, value in zip(METRICS, (generated - n_groups, generated * G,
                                        informative / n_groups, len(passes))):
            log_metric(trainer, key, value, "train")
        if sink is not None:
            sink(batch_step(trainer), _mark_trained(rows, [len(p.informative) for p in passes], picks, G,
                                     out["advantages"].tolist()))
        return out

    def _pass(self, trainer, batch: list[dict]) -> _Pass:
        out = generate_and_score(trainer, batch)
        _, rewards = step_rewards(trainer, len(batch))  # one process: this pass's rows
        return _Pass(out, rewards, informative_groups(rewards, trainer.num_generations))

    @staticmethod
    def _batch_scaled(passes: list[_Pass], picks, G: int, advantages: torch.Tensor) -> torch.Tensor:
        pass_std = torch.cat([reward_std(passes[p].rewards).expand(G) for p, _ in picks])
        batch = torch.cat([passes[p].rewards[g * G:(g + 1) * G] for p, g in picks])
        scaled = rescale_batch_advantages(advantages.cpu(), pass_std, float(reward_std(batch)))
        return scaled.to(advantages)


def _mark_trained(rows: list[dict], groups_per_pass: list[int], picks, G: int,
                  advantages: list[float]) -> list[dict]:
    """The step's rows (every pass, in generation order) with `trained` and, for trained
    rows, the advantage of the spliced batch."""
    starts = [sum(groups_per_pass[:p]) * G for p in range(len(groups_per_pass))]
    trained = {}
    for k, (p, g) in enumerate(picks):
        for j in range(G):
            trained[starts[p] + g * G + j] = advantages[k * G + j]
    out = []
    for i, row in enumerate(rows):
        row = {**row, "trained": i in trained}
        if i in trained:
            row["advantage"] = trained[i]
        out.append(row)
    return out


def dynamic_sampler(cfg, trainer) -> DynamicSampler | None:
    """The round's sampler (None when dynamic_sampling is off); refuses, before any
    step, what it cannot do."""
    ds = cfg.dynamic_sampling
    if not ds.enabled:
        return None
    if trainer.accelerator.num_processes > 1:
        raise ValueError(
            f"dynamic_sampling runs in one training process; this round has "
            f"{trainer.accelerator.num_processes} (train.num_processes): every refill pass "
            "would have to run in lockstep on all ranks. Set train.num_processes: 1 or "
            "dynamic_sampling.enabled: false")
    if getattr(trainer, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        raise ValueError(
            "dynamic_sampling needs TRL's multi_objective_aggregation "
            "'sum_then_normalize' (its 'normalize_then_sum' normalises over the whole batch, "
            "which splicing groups from several passes would change); drop it from grpo "
            "or disable dynamic_sampling")
    return DynamicSampler(trainer.train_dataset, ds.max_regenerations, cfg.project.seed)
