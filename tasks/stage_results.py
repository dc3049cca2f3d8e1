"""What each pipeline stage hands on, typed: one model per stage kind, each with the
stage's MLflow run, its seconds, whether it was served from the cache, its peak memory,
and the stage's own fields. A result saves and loads itself (JSON, written atomically):
the stage cache (tasks/cache.py) stores exactly this, so a cache hit, a resumed run and
a stage run elsewhere all read back the same type, never a dict by string key.

`cached` is not saved: it says how this run got the result (StageCache.get sets it),
and the Prefect task of the stage reports it as the `Cached` state (tasks/stage_run.py).
`paths`: what the result points at on disk (checkpoints); an entry whose paths are gone
is stale and the stage runs again."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.pool import PoolRef
from grpo_core.eval.comparison import ci_text
from grpo_core.eval.metric_names import eval_metrics
from grpo_core.eval.score import Scores
from grpo_core.findings import Finding, count_findings
from grpo_core.modeling.gpu import GPU_PEAK_METRIC
from grpo_core.train.memorisation import GapResult
from grpo_core.train.throughput import (
    PREFIX,
    RSS_PEAK_METRIC,
    format_memory,
    format_throughput,
)
from grpo_core.workspace import write_atomic


def _metric_text(m: dict | None) -> str:
    if not m or m.get("mean") is None:
        return "n/a"
    return ci_text(m["mean"], m.get("lo"), m.get("hi"))


class StageResult(BaseModel):
    """Fields every stage has; subclasses add their own."""

    model_config = ConfigDict(extra="forbid")
    kind: ClassVar[str] = ""

    mlflow_run: str | None = None  # the stage's child run (where its artifacts are)
    seconds: float | None = None  # what the stage measured itself (stage/seconds)
    cached: bool = Field(default=False, exclude=True)  # served from the cache in this run
    gpu_peak_gb: float | None = None  # CUDA only (grpo_core.modeling.gpu.stage_memory)
    rss_peak_gb: float | None = None  # grpo_core.train.throughput.rss_peak
    paths: list[str] = []  # files the result points at; gone = stale entry

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> None:
        """Write the result as JSON, atomically (a killed run leaves no half entry)."""
        write_atomic(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: str | Path, cached: bool = False):
        """The result saved at `path`, or None when it is missing, unreadable, of another
        shape (an older code version's) or stale (a path it points at is gone)."""
        try:
            value = cls.model_validate_json(Path(path).read_text())
        except (OSError, ValueError):
            return None
        if any(not Path(p).exists() for p in value.paths):
            return None
        return value.model_copy(update={"cached": cached})

    # ------------------------------------------------------------------ what is logged
    def metrics(self) -> dict[str, float]:
        """The stage's own numbers for its MLflow run (memory and seconds apart)."""
        return {}

    def memory_metrics(self) -> dict[str, float]:
        out = {GPU_PEAK_METRIC: self.gpu_peak_gb} if self.gpu_peak_gb is not None else {}
        return {**out, **({RSS_PEAK_METRIC: self.rss_peak_gb} if self.rss_peak_gb is not None
                          else {})}

    def memory_text(self) -> str:
        return format_memory({"gpu_peak_gb": self.gpu_peak_gb, "rss_peak_gb": self.rss_peak_gb})

    def summary(self, primary: str = "") -> str:
        """The stage line's key number, then the stage's figures (tasks/runner.py)."""
        return "; ".join(f for f in (self.key(primary), self.memory_text()) if f)

    def key(self, primary: str = "") -> str:
        return ""


class DataResult(StageResult):
    """The data stage: the stored pool and what ingest counted."""

    kind: ClassVar[str] = "data"
    pool: str  # the stored pool's content fingerprint
    pool_size: int
    ingested: int = 0
    quarantined: int = 0
    duplicates: int = 0
    contaminated: int = 0
    contamination: dict[str, dict[str, int]] = {}  # {bench: {"flagged", "excluded"}}

    def pool_ref(self) -> PoolRef:
        """What the later stages read the pool by (tasks/stage_data.py)."""
        return PoolRef(self.pool, self.pool_size)

    def metrics(self) -> dict[str, float]:
        out = {f"data/{k}": getattr(self, k) for k in
               ("pool_size", "ingested", "quarantined", "duplicates", "contaminated")}
        for bench, counts in self.contamination.items():
            out.update({f"data/contamination/{bench}/{k}": n for k, n in counts.items()})
        return out

    def key(self, primary: str = "") -> str:
        return (f"{self.pool_size} problems in the pool, {self.quarantined} quarantined, "
                f"{self.contaminated} contaminated")


FILTER_COUNTS = ("kept", "considered", "too_easy", "in_band", "too_hard", "reused",
                 "estimated", "sampled")


class FilterResult(StageResult):
    """A difficulty filter round: its counts, what it kept, every estimate's pass rate."""

    kind: ClassVar[str] = "filter"
    kept: int
    considered: int
    too_easy: int = 0
    in_band: int = 0
    too_hard: int = 0
    reused: int = 0
    estimated: int = 0
    sampled: int = 0
    report: dict[str, Any] = {}  # the rest of grpo_core.eval.difficulty's summary()
    kept_ids: list[str] = []  # the in-band problems
    signal_ids: list[str] = []  # problems with pass rate in (0, 1): reward variance
    pass_rates: list[float] = []
    need: int = 0  # prompts one GRPO optimizer step needs (stage_split.prompts_per_update)

    def trains_on(self) -> str:
        """What the round trains on, decided here once (flows.pipeline.training_prompts
        acts on it, the stage line says it): "band" when the in-band problems fill one
        optimizer step, else "signal" (every problem with pass rate in (0, 1)) when those
        do, else "window" (all the round's candidates)."""
        if self.kept >= self.need:
            return "band"
        return "signal" if len(self.signal_ids) >= self.need else "window"

    @classmethod
    def from_summary(cls, summary: dict, **fields) -> FilterResult:
        """From FilterReport.summary(): its counts as fields, the rest kept as `report`."""
        counts = {k: summary[k] for k in FILTER_COUNTS if k in summary}
        rest = {k: v for k, v in summary.items() if k not in counts}
        return cls(**counts, report=rest, **fields)

    def metrics(self) -> dict[str, float]:
        return {f"filter/{k}": getattr(self, k) for k in FILTER_COUNTS}

    def key(self, primary: str = "") -> str:
        share = f" ({self.kept / self.considered:.0%})" if self.considered else ""
        said = f"kept {self.kept} of {self.considered}{share}"
        fallback = {"signal": f"the {len(self.signal_ids)} with pass rate in (0, 1)",
                    # the window may hold more than the filter estimated: no count
                    "window": "all the round's candidates"}.get(self.trains_on())
        if fallback:  # the line says what the round trains on, as the finding will
            said += f"; too few for one step of {self.need}: the round trains on {fallback}"
        return said


class TrainResult(StageResult):
    """What both training stages hand on: the model and what the rules noted."""

    model_dir: str
    steps: int
    findings: list[Finding] = []
    stopped_early: bool = False
    diagnosis: str = "none"  # the rules' codes, info ones too
    throughput: dict[str, float] = {}  # the round's figures (grpo_core.train.throughput)
    compute: dict[str, float] = {}  # what it spent (throughput.training_compute)
    trained_sample: list[str] = []  # up to probe.problems ids it trained on, most used first

    def key(self, primary: str = "") -> str:
        return f"{self.steps} steps" + (" (stopped early)" if self.stopped_early else "")

    def summary(self, primary: str = "") -> str:
        figures = " | ".join(f for f in (format_throughput(self.throughput),
                                         self.memory_text()) if f)
        said = count_findings(self.findings) if self.findings else ""  # as the round's page
        return (self.key() + (f"; {figures}" if figures else "") + (f"; {said}" if said else "")
                + (f"; diagnosis: {self.diagnosis}" if self.diagnosis != "none" else ""))


class SftStageResult(TrainResult):
    kind: ClassVar[str] = "sft"

    def metrics(self) -> dict[str, float]:
        return {"sft/steps": self.steps}


class GrpoStageResult(TrainResult):
    kind: ClassVar[str] = "grpo"
    train_seconds: float = 0.0  # TRL's train_runtime: the training loop alone
    best_step: int | None = None  # in_round_eval.every: the step whose model is handed on
    in_round_evals: list = []  # (step, held-out greedy accuracy)

    def metrics(self) -> dict[str, float]:
        return {"grpo/steps": self.steps, "grpo/findings": len(self.findings),
                **{f"{PREFIX}round/{k}": x for k, x in self.throughput.items()}}


class EvalResult(StageResult):
    """An eval stage: the model's score per benchmark (grpo_core.eval.score)."""

    kind: ClassVar[str] = "eval"
    benchmarks: Scores

    def metrics(self) -> dict[str, float]:
        return eval_metrics(self.benchmarks)

    def key(self, primary: str = "") -> str:
        return ", ".join(f"{bench} {primary} {_metric_text(v.metric(primary))}"
                         for bench, v in self.benchmarks.items())

    def scorer_errors(self) -> dict[str, int]:
        """{bench: scorer exceptions} of the benchmarks that had any."""
        return {b: n for b, v in self.benchmarks.items()
                if (n := v.metrics.get("scorer_errors"))}


class ProbeResult(StageResult):
    """The memorisation probe of a training stage (grpo_core.train.memorisation) and, after
    SFT, the model's RL-readiness on unseen RL-part prompts (grpo_core.train.readiness)."""

    kind: ClassVar[str] = "probe"
    gap: GapResult
    readiness: dict[str, float] = {}  # readiness/* metrics; empty after a GRPO round
    readiness_line: str = ""
    findings: list[Finding] = []

    def metrics(self) -> dict[str, float]:
        return {**self.gap.metrics(), **self.readiness}

    def key(self, primary: str = "") -> str:
        said = f"; {count_findings(self.findings)}" if self.findings else ""
        ready = f"; readiness: {self.readiness_line}" if self.readiness_line else ""
        return f"memorisation: {self.gap.line()}{ready}{said}"


class Compute(BaseModel):
    """What one recipe's run spent, stage kind by stage kind (`add` each stage's result):
    the comparison's compute columns (grpo_core.eval.compute). Seconds are each stage's own
    (a cached stage's are those it took when it ran); eval seconds are not training
    compute."""

    sft_s: float = 0.0
    sft_steps: int = 0
    filter_s: float = 0.0
    filter_samples: int = 0
    grpo_s: float = 0.0
    grpo_steps: int = 0
    eval_s: float = 0.0
    train_tokens: float = 0.0  # through the policy in training (SFT and GRPO)
    gen_tokens: float = 0.0  # generated by GRPO's rollouts
    train_tflop: float = 0.0  # 6 x parameters x trained tokens (SFT and GRPO)
    sft_tflop: float = 0.0  # SFT's share of train_tflop

    def add(self, result: object) -> object:
        """Count `result` in (a stage result of any kind; others pass through): it."""
        seconds = getattr(result, "seconds", None) or 0.0
        if isinstance(result, FilterResult):
            self.filter_s += seconds
            self.filter_samples += result.sampled
        elif isinstance(result, EvalResult):
            self.eval_s += seconds
        elif isinstance(result, TrainResult):
            if isinstance(result, SftStageResult):
                self.sft_s, self.sft_steps = self.sft_s + seconds, self.sft_steps + result.steps
                self.sft_tflop += result.compute.get("train_tflop", 0.0)
            else:
                self.grpo_s, self.grpo_steps = self.grpo_s + seconds, self.grpo_steps + result.steps
            self.train_tokens += result.compute.get("train_tokens", 0.0)
            self.gen_tokens += result.compute.get("gen_tokens", 0.0)
            self.train_tflop += result.compute.get("train_tflop", 0.0)
        return result


class PipelineResult(BaseModel):
    """What one recipe's pipeline run hands back (flows/pipeline.py grpo_pipeline): its
    parent run, the model it made, the final and base evaluations ({bench: the eval
    stage's record}), the findings, the registry's report (tasks/finish.py), the
    memorisation probes, what it spent, and this process's RSS after each round."""

    parent_run: str
    model_dir: str
    final: Scores
    base: Scores = {}
    findings: list[Finding] = []
    registered: dict[str, Any] = {}
    memorisation: list[ProbeResult] = []
    compute: Compute = Field(default_factory=Compute)
    pipeline_rss_gb: list[float] = []
