"""The pipeline's TRL trainers: every override of a private member of TRL's, transformers'
or accelerate's trainers is here (tests/test_trl_contract.py pins each name below against
the installed versions and scans the project for others).

- `PipelineGRPOTrainer` (TRL's GRPOTrainer) and `PipelineRLOOTrainer` (TRL's RLOOTrainer):
  every scored completion goes to `rollout_sink`, rollouts end at `stop_strings`, hopeless
  batches skip their update (`skip_update_below`), DAPO's `dynamic_sampling` refills a
  batch, `rebaseline` (the algorithms' hook) may replace TRL's advantages, and save_model
  writes the weights in `save_dtype` when set.
- `AuxiliaryGRPOTrainer`: the above, training modules beside the policy (PPO's critic,
  grpo_vhead's head; grpo_core.train.auxiliary) with `auxiliary_loss` added to TRL's.
- `PipelineSFTTrainer`: TRL's SFTTrainer saving in `save_dtype`.

What the rest of grpo_core reads and sets inside a trainer (its step metrics, rewards,
tokenizer, sampling, a skipped optimizer step, ...) goes through the functions of
grpo_core/train/trainer_internals.py: with this module, the one door to those private
members. A trainer's settings through public API alone (stop strings on `model.generate`,
no log printing, one completion per prompt) are grpo_core/train/trainer_setup.py's.

PRIVATE lists every private member used here, with the owner it is read from."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from transformers import Trainer
from trl import GRPOTrainer, RLOOTrainer, SFTTrainer

from grpo_core.train import lora
from grpo_core.train.auxiliary import AUX_FILE
from grpo_core.train.throughput import StepCounts
from grpo_core.train.trainer_internals import batch_step, log_metric, step_rewards

# (owner, member): every private member this module touches. The contract test pins each
# one's signature and the shape relied on (tests/test_trl_contract.py).
PRIVATE = (
    (GRPOTrainer, "_generate_single_turn"),  # overridden: returns (ids, logprobs)
    (RLOOTrainer, "_generate_single_turn"),  # overridden: returns the ids alone
    (GRPOTrainer, "_generate_and_score_completions"),  # overridden: a dict
    (RLOOTrainer, "_generate_and_score_completions"),
    (GRPOTrainer, "_calculate_rewards"),  # overridden: timed (the step's scoring seconds)
    (RLOOTrainer, "_calculate_rewards"),
    (GRPOTrainer, "_get_per_token_logps_and_entropies"),  # overridden: timed inside scoring
    (RLOOTrainer, "_get_per_token_logps_and_entropies"),
    (GRPOTrainer, "_compute_loss"),  # overridden: the auxiliary loss is added
    (GRPOTrainer, "_logs"),  # read (prompts, completions, advantages), advantages replaced
    (GRPOTrainer, "_tokenizer"),  # read: the stop strings' tokenizer
    (RLOOTrainer, "_logs"),
    (RLOOTrainer, "_tokenizer"),
    (Trainer, "_save"),  # overridden: weights in save_dtype
    (Trainer, "_clip_grad_norm"),  # overridden: the auxiliary modules' clip
    (Trainer, "_save_checkpoint"),  # overridden: the auxiliary modules' weights
    (Trainer, "_get_output_dir"),  # where _save_checkpoint writes
    (Trainer, "_load_optimizer_and_scheduler"),  # overridden: the auxiliary weights back
)


# ----------------------------------------------------------------------------- mixins


class SavesInDtype:
    """save_model writes the weights in `save_dtype` when that is set (the final model;
    checkpoints stay float32 so a resumed round loses nothing)."""

    save_dtype = None

    def _save(self, output_dir=None, state_dict=None):
        if self.save_dtype is None:
            return super()._save(output_dir, state_dict)
        if lora.is_lora(self.accelerator.unwrap_model(self.model)):  # merged + adapter/
            return lora.save_merged(self.accelerator.unwrap_model(self.model),
                                    output_dir or self.args.output_dir, self.save_dtype,
                                    state_dict)
        if state_dict is None:
            state_dict = self.accelerator.unwrap_model(self.model).state_dict()
        cast: dict = {}  # by storage: tied weights stay one tensor
        state_dict = {k: cast.setdefault((v.data_ptr(), v.shape), v.to(self.save_dtype))
                      if v.is_floating_point() else v for k, v in state_dict.items()}
        super()._save(output_dir, state_dict)
        config = Path(output_dir or self.args.output_dir) / "config.json"
        if self.args.should_save and config.is_file():
            # save_pretrained records the in-memory (float32) dtype; the file holds save_dtype
            tree = json.loads(config.read_text())
            tree["dtype"] = str(self.save_dtype).removeprefix("torch.")
            config.write_text(json.dumps(tree, indent=2, sort_keys=True) + "\n")


class MeasuresThroughput:
    """Counts what a training step does, for grpo_core.train.callbacks.Throughput: the
    wall time of the generate-and-score calls (outermost only: dynamic sampling's passes
    are inside one) and, inside them, of sampling, reward scoring and the old/reference
    log-prob forwards; the completion tokens generated, and the prompt + completion tokens
    trained on (padding excluded). Measures only: nothing sampled or trained changes."""

    step_counts: StepCounts
    _scoring_depth: int = 0

    def _counting(self) -> bool:
        return self.model.training

    def _timed(self, part: str, call, *args, **kwargs):
        """`call(*args, **kwargs)`, its seconds added to the step's `part` while scoring."""
        if not (self._counting() and self._scoring_depth):
            return call(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            counts = self._counts()
            setattr(counts, part, getattr(counts, part) + time.perf_counter() - t0)

    def _generate_single_turn(self, *args, **kwargs):
        res = self._timed("sample_seconds", super()._generate_single_turn, *args, **kwargs)
        if self._counting():
            ids = res[0] if isinstance(res, tuple) else res  # GRPO: (ids, logprobs)
            self._counts().gen_tokens += sum(len(row) for row in ids)
        return res

    def _calculate_rewards(self, *args, **kwargs):
        return self._timed("score_seconds", super()._calculate_rewards, *args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # inside generate-and-score: the old policy's and the reference's forwards (no grad);
        # the policy's own forward for the loss runs outside it, in train_seconds
        return self._timed("logprob_seconds", super()._get_per_token_logps_and_entropies,
                           *args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        if not self._counting():
            return super()._generate_and_score_completions(inputs)
        t0 = time.perf_counter()
        self._scoring_depth += 1
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._scoring_depth -= 1
            if self._scoring_depth == 0:
                self._counts().gen_seconds += time.perf_counter() - t0

    def compute_loss(self, model, inputs, *args, **kwargs):
        if self._counting():
            self._counts().train_tokens += sum(int(inputs[k].sum()) for k in
                                               ("prompt_mask", "completion_mask") if k in inputs)
        return super().compute_loss(model, inputs, *args, **kwargs)

    def _counts(self) -> StepCounts:
        if "step_counts" not in self.__dict__:
            self.step_counts = StepCounts()
        return self.step_counts


class RecordsRollouts:
    """Hands every scored completion to a sink; optionally skips hopeless batches.
    `rebaseline` is the algorithms' hook (algorithm.name): it may replace TRL's
    advantages before they are recorded and trained on."""

    rollout_sink = None  # grpo_core.train.grpo.RolloutSink: (step, one dict per completion)
    stop_strings: tuple[str, ...] = ()  # the template's closing tag
    skip_update_below: float | None = None
    skipped_updates: int = 0  # optimizer steps skipped
    skip_steps_left: int = 0  # optimizer steps still to skip on the current batch
    dynamic_sampling = None  # grpo_core.train.dynamic_sampling.DynamicSampler when on

    def _generate_single_turn(self, *args, **kwargs):
        """Completions end at the first stop string: what follows it is cut (a row of a
        batch keeps its padding; vLLM may overshoot inside a token) and eos is appended,
        so TRL scores text ending in </answer> and counts the row as terminated, not
        clipped (mask_truncated_completions would drop it from the loss)."""
        from grpo_core.generation.rollout import stop_index

        res = super()._generate_single_turn(*args, **kwargs)
        # GRPOTrainer returns (ids, logprobs); RLOOTrainer the ids alone
        completion_ids, logprobs = res if isinstance(res, tuple) else (res, None)
        eos = self._tokenizer.eos_token_id
        if not self.stop_strings or eos is None:
            return res
        for i, ids in enumerate(completion_ids):
            k = stop_index(self._tokenizer, list(ids), self.stop_strings)
            if k is None:
                continue
            completion_ids[i] = list(ids[:k]) + [eos]
            if logprobs is not None:  # vLLM: no sampled logprob for the added eos
                logprobs[i] = list(logprobs[i][:k]) + [None]
        return (completion_ids, logprobs) if isinstance(res, tuple) else completion_ids

    def rebaseline(self, out: dict, rewards) -> list[float] | None:
        """algorithm.name's advantages: replace out["advantages"] (this process's rows)
        given `rewards`, the (N,) weighted rewards of every process's rows (NaN where
        unscorable), and return the N per-row advantages to record; None keeps TRL's."""
        return None

    def _generate_and_score_completions(self, inputs):
        ds = self.dynamic_sampling
        if ds is not None and self.model.training and not ds.in_pass:
            return ds.fill(self, inputs)  # calls this method back once per generation pass
        out = super()._generate_and_score_completions(inputs)
        # TRL's logs hold this step's rows gathered from every process; `out` holds
        # this process's slice. Record them all, once, on the main process.
        n = len(out["advantages"]) * self.accelerator.num_processes
        rewards, weighted = step_rewards(self, n)
        if type(self).rebaseline is not RecordsRollouts.rebaseline:
            recorded = self.rebaseline(out, weighted)
            if recorded is not None:  # in TRL's logs (completions table, rollout rows)
                logged = self._logs["advantages"]
                for _ in range(n):
                    logged.pop()
                logged.extend(recorded)
        totals = torch.where(torch.isnan(weighted), 0.0, weighted).tolist()  # unscored: 0
        advantages = list(self._logs["advantages"])[-n:]
        if self.skip_update_below is not None and totals and max(totals) < self.skip_update_below:
            # No signal: every optimizer step on this batch is skipped (SkipUpdate).
            # Every rank sees the same gathered rewards, so every rank skips.
            out["advantages"] = out["advantages"] * 0.0
            advantages = [0.0] * n
            self.skip_steps_left = self.num_iterations
        if self.rollout_sink is not None:
            self._sink_rows(inputs, rewards, totals, advantages, n)
        return out

    def _sink_rows(self, inputs, rewards: dict, totals: list, advantages: list, n: int) -> None:
        meta = [(x.get("problem_id"), x.get("answer")) for x in inputs]
        if self.accelerator.num_processes > 1:  # collective: every rank calls it
            from accelerate.utils import gather_object

            meta = gather_object(meta)
        if not self.accelerator.is_main_process:
            return
        prompts = list(self._logs["prompt"])[-n:]
        completions = list(self._logs["completion"])[-n:]
        self.rollout_sink(batch_step(self), [{
            "prompt": prompts[i],
            "completion": c if isinstance(c := completions[i], str) else c[-1]["content"],
            "problem_id": meta[i][0] if i < len(meta) else None,
            "answer": meta[i][1] if i < len(meta) else None,
            "rewards": {k: v[i] for k, v in rewards.items()},
            "reward": totals[i],
            "advantage": advantages[i] if i < len(advantages) else None,
        } for i in range(n)])


class TrainsAuxiliary:
    """Trains `aux` modules {name: (module, lr)} with the policy (grpo_core.train.auxiliary):
    their own parameter group and gradient clip, their weights in every checkpoint, and
    `auxiliary_loss` added to TRL's loss. Set `aux` (add_auxiliary) before train()."""

    aux: dict = {}

    def aux_parameters(self) -> list:
        return [p for module, _ in self.aux.values() for p in module.parameters()]

    def auxiliary_loss(self, inputs: dict, loss: torch.Tensor) -> torch.Tensor:
        """TRL's `loss` on the micro-batch `inputs` with the auxiliary modules' added."""
        return loss

    def _compute_loss(self, model, inputs):
        return self.auxiliary_loss(inputs, super()._compute_loss(model, inputs))

    def create_optimizer(self, model=None):
        opt = super().create_optimizer(model)
        held = {id(p) for group in opt.param_groups for p in group["params"]}
        for module, lr in self.aux.values():
            params = [p for p in module.parameters() if id(p) not in held]
            if params:  # TRL's scheduler scales every group's lr alike
                opt.add_param_group({"params": params, "lr": lr, "weight_decay": 0.0})
        return opt

    def _clip_grad_norm(self, model):
        norm = super()._clip_grad_norm(model)
        params = [p for p in self.aux_parameters() if p.grad is not None]
        if params:
            aux = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
            log_metric(self, "aux/grad_norm", aux, "train")
        return norm

    def _save_checkpoint(self, model, trial):
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"checkpoint-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            for name, (module, _) in self.aux.items():
                torch.save(module.state_dict(), os.path.join(folder, AUX_FILE.format(name=name)))
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is not None:
            for name, (module, _) in self.aux.items():
                path = os.path.join(checkpoint, AUX_FILE.format(name=name))
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"{path}: the checkpoint lacks the {name} weights "
                                            "its optimizer state belongs to")
                module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        super()._load_optimizer_and_scheduler(checkpoint)


# ----------------------------------------------------------------------------- trainers


class PipelineGRPOTrainer(MeasuresThroughput, RecordsRollouts, SavesInDtype, GRPOTrainer):
    """TRL's GRPOTrainer with the pipeline's hooks (see the module doc)."""


class PipelineRLOOTrainer(MeasuresThroughput, RecordsRollouts, SavesInDtype, RLOOTrainer):
    """TRL's RLOOTrainer with the same hooks: it has GRPOTrainer's generate/score/log methods."""


class AuxiliaryGRPOTrainer(TrainsAuxiliary, PipelineGRPOTrainer):
    """PipelineGRPOTrainer training modules beside the policy (ppo, grpo_vhead)."""


class PipelineSFTTrainer(SavesInDtype, SFTTrainer):
    """TRL's SFTTrainer saving in `save_dtype` when set."""
