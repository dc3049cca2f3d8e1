"""The sections of the config that are not training: project, model, data, rollout,
filter, rewards, eval, train, tracking. Each field is documented where it is declared."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from grpo_core.config.base import Section


class ProjectConfig(Section):
    name: str = "grpo"
    """MLflow experiment and registered-model name stem."""
    recipe: str = "custom"
    """Label of the recipe (r1_zero, sft_grpo, ...), tagged on every run."""
    recipes: list[Literal["r1_zero", "sft_grpo"]] = Field(default_factory=list)
    """Run this config once per recipe named here and compare them side by side, as the
    main job does (`grpo run CONFIG`): r1_zero without the SFT cold start, sft_grpo with it
    (flows/recipes.py). Empty: one run, as `recipe` and `sft_stage.enabled` say."""
    recipe_overrides: dict[Literal["r1_zero", "sft_grpo"], dict[str, Any]] = Field(
        default_factory=dict)
    """Per recipe of `recipes`: config fields (nested, as in the YAML) it runs with on top of
    the rest (grpo_core.config.recipe_config); no `project` key (the recipes share it)."""
    seed: int = 0
    """Seeds data generation, sampling and training."""
    compute_match: bool = False
    """With `recipes`: SFT recipes first, then each recipe without SFT gets the GRPO steps
    that spend that SFT's training TFLOP (grpo_core/eval/compute.py)."""
    workdir: str | None = None
    """Local state (DuckDB, MLflow, checkpoints); default ./.grpo or $GRPO_WORKDIR."""


class PeftConfig(Section):
    """LoRA adapters (grpo_core/train/lora.py): TRL trains them on the frozen base, the
    reference is the base with adapters disabled, the saved model is merged."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight (SFT and GRPO)."""
    r: int = Field(default=16, ge=1)
    """Adapter rank."""
    alpha: int = Field(default=32, ge=1)
    """LoRA alpha: the update is scaled by alpha / r."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input. 0: GRPO's ratio compares two forward passes."""
    target_modules: str | list[str] = "all-linear"
    """`all-linear` (every linear layer but the LM head) or module names (q_proj, ...)."""


class ModelConfig(Section):
    name_or_path: str = "builtin:tiny-arith"
    """Hugging Face id, local path, `builtin:tiny-arith` (built offline in-process), or
    `builtin:proxy-qwen2` (a random bf16 Qwen2 with multi-token tags and ChatML: runs the
    real presets' code paths on a CPU; its answers are noise)."""
    template: Literal["auto", "r1_zero", "chat"] = "auto"
    """Prompt template: R1-Zero text template for base models, chat template for instruct."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: train.precision's rule (modeling.loading.resolve_precision): bfloat16 on a GPU
    that supports it, else float16; float32 on CPU."""
    gguf_file: str | None = None
    """GGUF file inside name_or_path, when the weights are GGUF."""
    hub_token: SecretStr | None = None
    """Hugging Face token for gated or private models (better: the HF_TOKEN env var).
    Never written anywhere: dumps, hashes, MLflow and Prefect see `**********`."""
    peft: PeftConfig = Field(default_factory=PeftConfig)
    """LoRA (off by default)."""


# Levels of the synthetic arithmetic task (grpo_core/data/synthetic.py has levels 1-5).
SyntheticLevels = list[Annotated[int, Field(ge=1, le=5)]] | None


class DataSource(Section):
    source: str
    """Preset (gsm8k, math, math500, aime24, aime25, amc23), synthetic:arith, file path or hub id."""
    split: str | None = None
    """Split to read; default: the source's train split."""
    limit: int | None = Field(default=None, ge=1)
    """Keep at most this many problems (after shuffling with the seed)."""
    columns: dict[str, str] | None = None
    """Column mapping for generic files: {problem: col, answer: col, solution: col, ...}."""
    levels: SyntheticLevels = None
    """Synthetic task: difficulty levels to generate (1-5); default all. Honoured by the
    pipeline's ingest, `grpo filter` (for this source) and `grpo data ingest --levels`."""
    config: str | None = None
    """Hub dataset: which of its configs (name); list a source per config to read several."""


class DataConfig(Section):
    train: list[DataSource] = Field(default_factory=lambda: [DataSource(source="synthetic:arith")])
    """Training pool sources."""
    data_dir: str | None = None
    """Local copies laid out like shared/data; default $GRPO_DATA_DIR."""
    decontaminate: bool = True
    """Exclude training problems sharing an n-gram with an eval set."""
    decontam_ngram: int = Field(default=8, ge=3)
    """n of the decontamination n-gram (after normalisation)."""
    max_problem_chars: int = Field(default=20000, ge=100)
    """Rows with longer problem text are quarantined as absurd."""
    store_lock_timeout: float = Field(default=60.0, ge=0)
    """Seconds to wait for the DuckDB store when another pipeline holds it."""
    sft_share: float = Field(default=0.5, ge=0, le=1)
    """Share of the pool in the SFT part, by a stable hash of each problem: SFT reads only
    that part, the filter and GRPO only the rest (the RL part), so GRPO never trains on a
    problem SFT fitted. Both recipes read the same RL part."""
    stage_overlap: bool = False
    """Ablation only: SFT and GRPO both read the whole pool (the stages share problems);
    the run says so in a finding."""
    allow_eval_split_training: bool = False
    """Allow a training source that is a benchmark's evaluation split (gsm8k test,
    math500, aime, amc). Off: such a config is refused; its numbers would be contaminated."""

    @model_validator(mode="after")
    def _no_eval_split(self) -> DataConfig:
        from grpo_core.data.benchmarks import is_eval_split

        for i, src in enumerate(self.train):
            if is_eval_split(src.source, src.split) and not self.allow_eval_split_training:
                raise ValueError(
                    f"train.{i}: {src.source} ({src.split or 'default split'}) is an evaluation "
                    "split; train on its train split, or set data.allow_eval_split_training")
        return self


class RolloutConfig(Section):
    backend: Literal["auto", "hf", "vllm"] = "auto"
    """auto: vllm where it can run (its CUDA build with a GPU, or its CPU build:
    `make setup-vllm`), else hf."""
    batch_size: int = Field(default=64, ge=1)
    """Sequences generated per forward batch (hf backend)."""
    drop_finished_rows: bool = True
    """hf backend: a row that reached its stop leaves the batch (its KV cache with it), so
    each decoding step computes only the rows still running instead of the whole batch
    until its longest row ends. False: transformers `generate` over fixed batches."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Completion budget for filtering/eval sampling."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor parallel size."""
    data_parallel_size: int = Field(default=1, ge=1)
    """vLLM data parallel size (engine replicas) for filter and eval sampling. The offline
    engine supports it for mixture-of-experts models only (a dense model is refused when the
    engine starts): for more throughput on a dense model, shard the filter/eval instead."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """vLLM share of GPU memory."""
    max_model_len: int | None = Field(default=None, ge=16)
    """vLLM: the longest prompt + completion a request may hold. None: the model's own on a
    GPU, 1024 on CPU (the CPU engine's start-up profile run is a forward pass that long)."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """vLLM on CPU: GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE; an exported value wins)."""
    reuse_engine: bool = True
    """vLLM: keep a filter or eval stage's engine for the next stage when it asks for the same
    model with the same settings (eval/sft then filter/round-1, eval/round-N then
    filter/round-N+1): one start instead of two (40-100 s each on a CPU). Released before
    every training stage. Results do not change (every request carries its own seed)."""


class FilterConfig(Section):
    enabled: bool = True
    """Keep only prompts the current policy solves within the band."""
    k: int = Field(default=8, ge=1)
    """Samples per prompt to estimate its pass rate."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature of the estimate (the rollout temperature)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    band: tuple[float, float] = (0.3, 0.7)
    """Keep prompts whose pass rate lies in [lo, hi]."""
    max_problems: int | None = Field(default=None, ge=1)
    """Candidates per round: round N's filter considers the N-th window of this many
    RL-part problems in the pool's seeded order, fresh every round (None: the RL part
    shared equally between the rounds)."""
    reuse_prompts: bool = False
    """When the RL part has no fresh window left for a round, start over from its first
    rows instead of stopping with the numbers and the fix."""
    refilter_each_round: bool = True
    """Re-estimate pass rates under the current policy before every round."""
    shards: int = Field(default=1, ge=1)
    """Split the missing estimates across this many worker processes (a Prefect flow,
    flows/shards.py); 1 estimates in the pipeline's process. The rows do not change."""
    shard_runner: Literal["process", "ray", "dask"] = "process"
    """Where shards run when shards > 1: a local process pool, or a Ray / Dask cluster
    (extras grpo-pipeline[ray] / [dask]; workers need the model path and a shared folder)."""
    adaptive: bool | Literal["exact"] = False
    """Sample in rounds (k the cap; the fixed-k estimate's first samples) and stop a problem once
    its interval lies wholly outside or inside the band (true), or once no later sample could
    change its class or (0, 1) ("exact": fixed k's result, fewer samples; eval/adaptive.py)."""
    adaptive_start: int = Field(default=4, ge=1)
    """Samples every problem draws in the first round of an adaptive estimate."""
    adaptive_step: int = Field(default=4, ge=1)
    """Samples added per later round, up to k."""
    adaptive_confidence: float = Field(default=0.8, gt=0, lt=1)
    """Two-sided level of the Wilson interval the adaptive stop tests (stored: the 95% one)."""
    rollout_evidence_weight: float = Field(default=0.0, ge=0, le=1)
    """What one of the previous round's GRPO rollouts of a problem counts for, in fresh
    samples, in the next round's estimate (capped at k/2 in all; grpo_core/eval/evidence.py);
    0 turns it off."""

    @field_validator("band")
    @classmethod
    def _band_ordered(cls, band: tuple[float, float]) -> tuple[float, float]:
        lo, hi = band
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got [{lo}, {hi}]")
        return band


class LengthRewardConfig(Section):
    min_tokens: int = Field(default=200, ge=0)
    max_tokens: int = Field(default=800, ge=1)
    penalty: float = Field(default=-0.5, le=0)
    """Reward at zero length / at twice max_tokens; linear in between."""

    @model_validator(mode="after")
    def _ordered(self) -> LengthRewardConfig:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be <= max_tokens")
        return self


class SoftOverlongConfig(Section):
    """DAPO's overlong reward shaping: 0 up to max_tokens - buffer_tokens, then a linear
    ramp to `penalty` at max_tokens (and beyond)."""

    max_tokens: int | None = Field(default=None, ge=2)
    """None: grpo.max_completion_length (where TRL truncates)."""
    buffer_tokens: int | None = Field(default=None, ge=1)
    """Length of the ramp; None: a fifth of max_tokens (DAPO: 4096 of 20480)."""
    penalty: float = Field(default=-1.0, le=0)

    def resolved(self, max_completion_length: int) -> tuple[int, int]:
        """(max_tokens, buffer_tokens) with the defaults filled in."""
        top = self.max_tokens or max_completion_length
        return top, min(self.buffer_tokens or max(1, top // 5), top)


class KeywordRewardConfig(Section):
    keywords: list[str] = Field(
        default_factory=lambda: ["therefore", "so", "thus", "hence", "because", "因此", "所以"]
    )
    per_hit: float = Field(default=0.1, ge=0)
    max_reward: float = Field(default=0.5, ge=0)


class RepetitionRewardConfig(Section):
    ngram: int = Field(default=3, ge=1)
    max_penalty: float = Field(default=-0.5, le=0)


class RewardsConfig(Section):
    funcs: list[str] = Field(default_factory=lambda: ["accuracy", "format"])
    """Reward functions by registry name (grpo_core.verify.rewards.REWARDS)."""
    weights: list[float] | None = None
    """One weight per function; None means all 1.0."""
    extraction: Literal["strict", "flexible"] = "strict"
    """How `accuracy` reads a completion's final answer, and so how the difficulty filter
    and the rollout evidence count a success: strict, the template's <answer> / \\boxed{}
    (R1: an untagged answer scores 0); flexible, the standard evaluators' chain down to
    the last number (zero-RL as SimpleRL-Zoo: correctness of the answer a base model
    actually writes, with no format gate; a format reward, if listed, is a bonus beside it)."""
    format_reward: float = 0.5
    """+format_reward for <think>..</think><answer>..</answer>, minus it otherwise."""
    length: LengthRewardConfig = Field(default_factory=LengthRewardConfig)
    soft_overlong: SoftOverlongConfig = Field(default_factory=SoftOverlongConfig)
    reasoning_keywords: KeywordRewardConfig = Field(default_factory=KeywordRewardConfig)
    repetition: RepetitionRewardConfig = Field(default_factory=RepetitionRewardConfig)

    @model_validator(mode="after")
    def _check(self) -> RewardsConfig:
        from grpo_core.verify.rewards import REWARDS  # late: rewards imports nothing from here

        if not self.funcs:
            raise ValueError("funcs: at least one reward function is needed")
        unknown = [f for f in self.funcs if f not in REWARDS]
        if unknown:
            raise ValueError(f"funcs: unknown reward {unknown[0]!r}; known: {sorted(REWARDS)}")
        if self.weights is not None and len(self.weights) != len(self.funcs):
            raise ValueError(
                f"weights: {len(self.weights)} weights for {len(self.funcs)} reward functions"
            )
        return self

    def resolved_weights(self) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(self.funcs)


class EvalConfig(Section):
    benchmarks: list[str] = Field(default_factory=lambda: ["synthetic"])
    """gsm8k, math500, aime24, aime25, amc23, synthetic, or a source ingested with split
    test/eval; always the evaluation split (grpo_core/data/benchmarks.py)."""
    limit: int | None = Field(default=None, ge=1)
    """Evaluate at most this many problems per benchmark (the first N, fixed)."""
    samples: int = Field(default=4, ge=1)
    """k for avg@k, maj@k, pass@k."""
    temperature: float = Field(default=0.6, ge=0)
    """R1 convention for sampled eval."""
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_new_tokens: int = Field(default=64, ge=1)
    max_truncated: float = Field(default=0.05, ge=0, le=1)
    """A delta whose earlier model was cut off at max_new_tokens in more than this share of
    its completions is flagged (eval_budget_truncates): the budget may decide it."""
    greedy: bool = True
    """Also report greedy accuracy."""
    bootstrap: int = Field(default=1000, ge=10)
    """Bootstrap resamples for the 95% CIs."""
    primary_metric: str = "greedy_accuracy"
    """Metric that decides champion promotion and the comparison: greedy_accuracy,
    avg@<samples>, maj@k or pass@k, scored with strict extraction (the template's own
    answer format); prefix `flexible/` to score with the standard evaluators' chain."""
    synthetic_levels: SyntheticLevels = None
    """Levels of the `synthetic` benchmark (1-5); default all five. Its problems, and so
    the protocol hash, change with them: numbers under other levels are not compared."""
    shards: int = Field(default=1, ge=1)
    """Score each benchmark's problems in this many worker processes (the sharded-eval
    flow, flows/shards.py; where they run: filter.shard_runner); 1 = in-process. The
    per-problem rows and the metrics do not change."""

    @model_validator(mode="after")
    def _known_metric(self) -> EvalConfig:
        from grpo_core.eval.metric_names import parse_metric, reported_at  # the one grammar

        k = self.samples
        if not reported_at(self.primary_metric, k):
            raise ValueError(f"primary_metric: {self.primary_metric!r} is not reported with "
                             f"samples={k} (use greedy_accuracy, avg@{k}, maj@j or pass@j with "
                             f"j <= {k}, optionally prefixed flexible/)")
        # one spelling of each metric (strict/avg@4 is avg@4)
        self.__dict__["primary_metric"] = parse_metric(self.primary_metric).name
        return self


class TrainConfig(Section):
    """How the stages run: in the pipeline's process, in a process of their own
    (stage_process), or through `accelerate launch` when more than one process is asked for."""

    stage_process: Literal["auto", "always", "never"] = "auto"
    """Where a stage that holds a model or an engine (filter, eval, SFT, a GRPO round) runs:
    always: in its own process through tasks/launch.py, which exits when the stage ends (all
    its memory, GPU or not, goes back); never: in the pipeline's process when the hardware
    allows (engines shut down, CUDA cache emptied at the stage's end); auto: always when
    CUDA is in use, never on CPU. Several processes or pinned GPUs always launch."""
    num_processes: int = Field(default=1, ge=1)
    """Processes in all (GPUs, or CPU processes on gloo). >1: the stage is launched with
    `accelerate launch`; each runs grpo.per_device_train_batch_size completions per pass."""
    num_machines: int = Field(default=1, ge=1)
    accelerate_config: str | None = None
    """An accelerate config file (infra/accelerate/*.yaml: DDP, ZeRO-2/3, FSDP); its
    relative path is read from the repository root. None: accelerate's defaults."""
    main_process_port: int | None = Field(default=None, ge=1, le=65535)
    """Rendezvous port; None picks a free one (single machine)."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """How SFT and GRPO train. The policy always loads in float32 (fp32 master weights,
    whatever dtype the checkpoint is stored in); bf16/fp16 add autocast on GPU (TRL's
    bf16/fp16 flags). auto: bf16 on a GPU that supports it, else fp16 on GPU, fp32 on CPU.
    Trained models are saved in the input checkpoint's stored dtype; model.dtype is the
    sampling dtype (filter, eval)."""
    vllm_server_launch: bool = True
    """grpo.use_vllm with grpo.vllm_mode server: the stage starts `trl vllm-serve` for the
    round on the first vllm_server_gpus visible GPUs and trains on the rest; False: use a
    server you run (at grpo.vllm_server_host / vllm_server_port)."""
    vllm_server_gpus: int = Field(default=1, ge=1)
    """GPUs the launched server takes (the first visible ones); they are split into
    vllm_server_data_parallel_size replicas of vllm_server_gpus / that many GPUs each
    (the server's tensor parallelism)."""
    vllm_server_data_parallel_size: int = Field(default=1, ge=1)
    """Engine replicas on the server's GPUs (trl vllm-serve --data_parallel_size): a model that
    fits one GPU serves fastest with one replica per GPU."""
    vllm_server_gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """The server's share of each of its GPUs (it has them to itself, unlike the filter's and
    eval's engine, rollout.gpu_memory_utilization)."""
    logprob_chunk_tokens: int | None = Field(default=None, ge=1)
    """Positions per tile of TRL's fused log-prob head (projected a tile at a time). None:
    TRL's 4096 on GPU (Triton), 512 on CPU, where TRL's torch fallback keeps ~33 bytes per
    tile element in backward (4.4 GB at TRL's tile; 0.14 GB at 512 x 8192). Set for each
    train() alone: the tile orders the head's float sums (weights differ in the last bits)."""
    logprob_chunk_vocab: int | None = Field(default=None, ge=1)
    """Vocabulary columns per tile of that head. None: TRL's 32768 on GPU, 8192 on CPU."""
    peak_tflops: float | None = Field(default=None, gt=0)
    """The peak TFLOP/s that throughput/mfu is computed against; None: on CUDA by the device's
    name (grpo_core/train/throughput.py PEAK_TFLOPS, bf16 dense; no MFU for a device not
    listed), on CPU this machine's fp32 matmul rate, measured (cpu_matmul_tflops).
    Measurement only: not in any stage's cache key."""

    @model_validator(mode="after")
    def _server_split(self):
        if self.vllm_server_gpus % self.vllm_server_data_parallel_size:
            raise ValueError(
                f"train.vllm_server_data_parallel_size={self.vllm_server_data_parallel_size} does "
                f"not divide train.vllm_server_gpus={self.vllm_server_gpus} (each replica takes "
                "vllm_server_gpus / vllm_server_data_parallel_size GPUs)")
        return self


class TrackingConfig(Section):
    tracking_uri: str | None = None
    """MLflow tracking URI; default $MLFLOW_TRACKING_URI or SQLite under the workdir."""
    experiment: str | None = None
    """MLflow experiment; default project.name."""
    register_model: bool = True
    flush_timeout_s: float = Field(default=120.0, ge=0)
    """At the end of a training stage, wait this long for an unreachable tracking server
    before keeping the unsent metric points in <workdir>/runs/unsent/ (sent next run)."""
