"""A diagnosis finding and how it is said: the one vocabulary the rules
(grpo_core/train/diagnosis.py) write and every stage, the CLI and the tracking pages read.

- `Finding`: a stable `code`, a `severity` (SEVERITIES: info|warn|stop), the `steps`, the
  `evidence`, the `stage` it is about, and the `action` (ACTIONS: the fix, one per code);
  `line()` says it in one line. Findings stay `Finding`s from the rule that fires to the
  page that shows them: only `line()` turns one into text.
- `count_findings(findings)`: the one count by severity, said the same on the round, the
  parent, the stage line and the report.
- `codes_tag(findings)`: the round's `diagnosis` tag."""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SEVERITIES = ("info", "warn", "stop")

ACTIONS = {
    "reward_collapse_zero": "too hard: re-filter (filter.refilter_each_round), lower filter.band, "
                            "or SFT first (sft_stage.enabled); a base model that never writes "
                            "the answer format: reward the answer it writes (rewards.extraction: "
                            "flexible, the zero-RL recipe)",
    "reward_collapse_one": "too easy: re-filter (filter.refilter_each_round) or raise filter.band",
    "no_diversity": "completions of a prompt agree: raise grpo.temperature or grpo.num_generations",
    "reward_fn_constant": "this reward teaches nothing (saturated or never hit): change its weight "
                          "(rewards.weights) or drop it; for a format never hit, SFT first",
    "length_shrinking": "check the length reward's sign and weight (rewards.length, "
                        "rewards.weights) and grpo.loss_type (grpo's per-sequence mean favours short)",
    "length_exploding": "check the length reward's sign and weight (rewards.length, "
                        "rewards.weights); add the soft_overlong reward (rewards.funcs)",
    "truncation": "raise grpo.max_completion_length, set grpo.mask_truncated_completions: "
                  "true, or add the soft_overlong reward (rewards.funcs, rewards.soft_overlong)",
    "format_dropping": "raise the format reward's weight (rewards.weights)",
    "kl_rising": "the policy drifts from the reference: lower grpo.learning_rate, raise grpo.beta "
                 "(or a rounds.kl_schedule), or set rounds.kl_ceiling",
    "reward_hacking_suspect": "a reward pays something other than the task (a shaping reward rises "
                              "while accuracy falls, or one wrong completion repeats across the "
                              "batch's prompts): lower that reward's weight or drop it, and read the "
                              "completions (the rollouts table)",
    "nonfinite": "the round stopped at the last good checkpoint: lower grpo.learning_rate, set "
                 "grpo.max_grad_norm, check the reward functions",
    "kl_ceiling": "the round stopped at the last good checkpoint: lower grpo.learning_rate or "
                  "raise grpo.beta",
    "sft_entropy_collapsed": "SFT left the policy too sure for GRPO to explore: fewer SFT steps "
                             "(sft.max_steps) or early stop, a higher grpo.temperature, or TRL's "
                             "adaptive entropy (grpo.use_adaptive_entropy: true, "
                             "grpo.entropy_target)",
    "sft_zero_variance": "most groups would teach nothing: raise grpo.temperature or "
                         "grpo.num_generations, or widen filter.band",
    "memorisation_gap": "the stage fits its own problems more than it learns the task: fewer "
                        "steps (sft.max_steps, grpo.max_steps), more distinct problems "
                        "(data.train limit, filter.max_problems), or a lower learning rate",
    "eval_budget_truncates": "the eval budget may decide this delta: re-evaluate at a larger "
                             "eval.max_new_tokens (the line names one; `grpo eval --set "
                             "eval.max_new_tokens=N`) and make it the config's",
    "prompt_repeats": "the round trains the same prompts over and over: more fresh candidates "
                      "(filter.max_problems, data.train limit), a wider filter.band, or fewer "
                      "grpo.max_steps",
    # What a stage notes on its way (not a rule over the per-step metrics): said the same way.
    "collapse": "re-filter difficulty (filter.refilter_each_round) or check the rewards",
    "repeated_output": "read the completions (the rollouts table): a reward may pay a pattern "
                       "rather than the task",
    "skipped_updates": "every reward of those batches was below rounds.skip_update_below: "
                       "re-filter (filter.refilter_each_round) or lower the threshold",
    "in_round_choice": "none: in_round_eval.every picked the checkpoint the round hands on",
    "in_round_stopped": "the held-out score kept falling: lower grpo.learning_rate or "
                        "grpo.max_steps, or raise in_round_eval.patience",
    "mlflow_unsent": "none: the next run sends the kept metric points",
    "contamination": "training rows match held-out problems: they were dropped from training "
                     "(data.decontaminate); check the source",
    "pool_window": "more data (data.train limit) or fewer rounds (rounds.count), steps "
                   "(grpo.max_steps) or candidates (filter.max_problems)",
    "stage_overlap": "an ablation: unset data.stage_overlap for stage-disjoint data",
    "few_in_band": "widen filter.band, raise filter.max_problems, or SFT first",
    "rounds_stopped": "the rounds so far made the model; re-filter or SFT first for more",
    "scorer_errors": "the scorer raised on some records (scored wrong): see the eval run's "
                     "scorer_errors and the records",
    "round_regressed": "rounds.rollback_on_regression handed the better model on; lower "
                       "grpo.learning_rate or grpo.max_steps",
    "champion_regressed": "the champion stays: see the retrain round's findings",
    "smoke_check": "see the smoke report's line for the check that failed",
}
"""code -> the fix, one per rule (docs/troubleshooting.md lists the codes)."""


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # info | warn | stop
    steps: list[int] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    summary: str = field(default="", compare=False)  # the evidence in words, for line()
    stage: str = ""  # the stage it is about ("data", "sft", "grpo/round-2"): line()'s prefix

    @classmethod
    def note(cls, code: str, summary: str, severity: str = "warn", stage: str = "",
             steps: Sequence[int] = (), **evidence) -> Finding:
        """What a stage notes on its way (ACTIONS' second half), as a finding."""
        return cls(code, severity, list(steps), evidence, summary, stage)

    @classmethod
    def of(cls, value: Finding | dict) -> Finding:
        """A finding back from JSON (a launched stage's result, the stage cache)."""
        if isinstance(value, Finding):
            return value
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in names})

    def at(self, stage: str) -> Finding:
        """This finding, said of `stage` (kept when it names one already)."""
        return self if self.stage else dataclasses.replace(self, stage=stage)

    @property
    def action(self) -> str:
        return ACTIONS[self.code]

    def as_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "steps": list(self.steps),
                "evidence": dict(self.evidence), "action": self.action,
                **({"stage": self.stage} if self.stage else {})}

    def line(self) -> str:
        steps = f" steps {step_ranges(self.steps)}" if self.steps else ""  # a stage's, not a step's
        where = f"{self.stage}: " if self.stage else ""
        return f"{where}{self.code} [{self.severity}]{steps}: {self.summary} -> {self.action}"

    def __str__(self) -> str:
        return self.line()


def step_ranges(steps: Sequence[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> "1-3, 7, 9-10"."""
    parts: list[str] = []
    for s in sorted(set(steps)):
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts) or "-"


def lines(findings: Iterable[Finding]) -> list[str]:
    return [f.line() for f in findings]


def count_findings(findings: Iterable[Finding]) -> str:
    """The one count of findings, by severity, said the same on the round, the parent, the
    stage line and the report: "no findings", "1 finding (1 info)", "3 findings (1 warn,
    2 info)" (the most severe first)."""
    by = Counter(f.severity for f in findings)
    total = sum(by.values())
    if not total:
        return "no findings"
    parts = ", ".join(f"{by[s]} {s}" for s in reversed(SEVERITIES) if by[s])
    return f"{total} finding{'s' if total > 1 else ''} ({parts})"


def codes_tag(findings: Sequence[Finding]) -> str:
    """The `diagnosis` tag: the codes, comma-separated, each once; "none" when none fired."""
    return ",".join(dict.fromkeys(f.code for f in findings)) or "none"
