"""The cache key of each pipeline stage (tasks/stages.py): one pure function per stage,
holding every input that changes the stage's result and nothing else
(tests/test_cache_keys.py checks both ways)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from grpo_core.config import PipelineConfig
from grpo_core.data.problems import Problem
from grpo_core.workspace import read_state, write_atomic
from tasks.cache import stage_key

# Left out on purpose: where or how visibly work runs (filter.shards/shard_runner,
# eval.shards, ports, timeouts, save cadence), what only later decisions read
# (eval.primary_metric, filter.enabled, filter.refilter_each_round, rounds.count,
# rounds.rollback_on_regression), MLflow settings (`tracking`), progress bars, the
# diagnosis thresholds (`diagnosis`: `grpo diagnose --run` re-reads a cached round).


def _sampling_model(cfg: PipelineConfig) -> dict:
    """The model settings that shape filter/eval samples (weights: the model fingerprint)."""
    return cfg.model.model_dump(mode="json", include={"template", "dtype", "gguf_file"})


def _peft(cfg: PipelineConfig) -> dict:
    """model.peft, for the training stages, only when on (LoRA off leaves keys as they were)."""
    return {"peft": cfg.model.peft.model_dump(mode="json")} if cfg.model.peft.enabled else {}


def _train_setup(cfg: PipelineConfig) -> dict:
    return cfg.train.model_dump(mode="json", exclude={"main_process_port", "peak_tflops",
                                                   "stage_process"})


def problems_fingerprint(problems: list[Problem]) -> str:
    """The exact problem list, every field in order: an id names a row of a source, not
    its content, so a re-ingested file with edited rows is a new key."""
    blob = json.dumps([p.to_row() for p in problems], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def data_files(cfg: PipelineConfig, digests: Path | None = None) -> dict[str, str | None]:
    """Content digest of each local file the training sources and the benchmarks read
    (preset copies under the data dir, file sources). Hub datasets are keyed by name.
    `digests`: a JSON file remembering each file's digest by (size, mtime), so an unchanged
    1 GB file is not read again at every lookup, and a file deleted after its ingest keeps
    the digest it was ingested with (the store holds its rows: the run goes on)."""
    from grpo_core.data.adapters import PRESETS
    from grpo_core.data.readers import shard_files
    from grpo_core.workspace import resolve_data_dir

    root = resolve_data_dir(cfg.data.data_dir)
    memo = _read_memo(digests)
    files: list[Path] = []
    for name in [s.source for s in cfg.data.train] + list(cfg.eval.benchmarks):
        if name in PRESETS and root is not None:
            files += [root / f for f in PRESETS[name].files.values()]
        elif name not in PRESETS and not name.startswith("synthetic:"):  # file, shard folder or glob
            shards = [str(f) for f in shard_files(name)]
            if memo is not None:
                shards = shards or memo["sources"].get(name, [])
                memo["sources"][name] = shards
            files += [Path(f) for f in shards]
    out = {str(f): _file_sha(f, memo and memo["files"]) for f in files}
    if digests is not None:
        _write_memo(digests, memo)
    return out


def _file_sha(path: Path, memo: dict | None = None) -> str | None:
    try:
        st = path.stat()
    except OSError:  # missing: the digest it was ingested with, else the ingest says so
        return (memo or {}).get(str(path), {}).get("sha")
    seen = (memo or {}).get(str(path))
    if seen and seen["size"] == st.st_size and seen["mtime_ns"] == st.st_mtime_ns:
        return seen["sha"]
    try:
        with path.open("rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()[:16]
    except OSError:
        return None
    if memo is not None:
        memo[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha": sha}
    return sha


def _read_memo(path: Path | None) -> dict | None:
    if path is None:
        return None
    memo = read_state(Path(path))
    return {"files": memo.get("files") or {}, "sources": memo.get("sources") or {}}


def _write_memo(path: Path, memo: dict) -> None:
    write_atomic(path, json.dumps(memo, indent=1, sort_keys=True))


def ingest_key(cfg: PipelineConfig, digests: Path | None = None) -> str:
    """`digests`: see data_files (the pipeline keeps it in the workspace's cache folder)."""
    from grpo_core.workspace import resolve_data_dir

    data = cfg.data.model_dump(mode="json", exclude={"store_lock_timeout", "data_dir"})
    root = resolve_data_dir(cfg.data.data_dir)
    return stage_key("data", data=data, data_dir=str(root) if root else None,
                     files=data_files(cfg, digests), benchmarks=cfg.eval.benchmarks,
                     seed=cfg.project.seed)


def filter_key(cfg: PipelineConfig, model_fp: str, problems_fp: str,
               evidence: str | None = None) -> str:
    """`evidence`: grpo_core.eval.evidence.evidence_fingerprint of the rollout priors (they
    hold rollout_evidence_weight); None without any. The adaptive rule's settings count
    only when it is on."""
    skip = {"shards", "shard_runner", "enabled", "refilter_each_round",
            "rollout_evidence_weight"}
    if not cfg.filter.adaptive:
        skip |= {"adaptive_start", "adaptive_step", "adaptive_confidence"}
    how = cfg.filter.model_dump(mode="json", exclude=skip)
    extra = {"evidence": evidence} if evidence else {}
    if cfg.rewards.extraction != "strict":  # how a success is read (strict: keys as before)
        extra["extraction"] = cfg.rewards.extraction
    return stage_key("filter", model=model_fp, problems=problems_fp, filter=how,
                     rollout=cfg.rollout.model_dump(mode="json", exclude={"reuse_engine"}),
                     sampling=_sampling_model(cfg),
                     seed=cfg.project.seed, **extra)


def sft_key(cfg: PipelineConfig, model_fp: str, problems_fp: str) -> str:
    return stage_key("sft", model=model_fp, problems=problems_fp,
                     sft=cfg.sft.model_dump(mode="json", exclude={"disable_tqdm"}),
                     max_examples=cfg.sft_stage.max_examples,
                     template=cfg.model.template, train=_train_setup(cfg), seed=cfg.project.seed,
                     **_peft(cfg))


def grpo_key(cfg: PipelineConfig, model_fp: str, problems_fp: str, round_no: int) -> str:
    skip = {"save_steps", "save_total_limit", "vllm_server_host", "vllm_server_port",
            "vllm_server_timeout", "disable_tqdm"}
    grpo = cfg.grpo.model_dump(mode="json", exclude=skip)
    # a run-long KL schedule's beta depends on the round count; a per-round one does not
    later = {"rollback_on_regression"}  # decided after the round, from its evaluation
    rounds = cfg.rounds.model_dump(mode="json", exclude=later | {"count"}
                                   if cfg.rounds.kl_schedule.per == "round" else later)
    in_round = cfg.in_round_eval.model_dump(mode="json")
    if cfg.in_round_eval.every:  # the in-round eval picks the round's model with eval's length limit
        in_round["eval_max_new_tokens"] = cfg.eval.max_new_tokens
    return stage_key("grpo", model=model_fp, problems=problems_fp, grpo=grpo, rounds=rounds,
                     algorithm=cfg.algorithm.model_dump(mode="json"),
                     dynamic_sampling=cfg.dynamic_sampling.model_dump(mode="json"),
                     in_round_eval=in_round,
                     rewards=cfg.rewards.model_dump(mode="json"), template=cfg.model.template,
                     round=round_no, seed=cfg.project.seed, train=_train_setup(cfg), **_peft(cfg))


def eval_key(cfg: PipelineConfig, model_fp: str, benchmarks: list[str],
             problem_sets: dict[str, str]) -> str:
    """`problem_sets`: benchmark -> grpo_core.data.benchmarks.fingerprint of its problem list.
    The exact lists are in the key: a changed store (another split, more rows) is a new
    evaluation, never a cached number from the old set."""
    how = cfg.eval.model_dump(mode="json", exclude={"shards", "benchmarks", "primary_metric"})
    return stage_key("eval", model=model_fp, benchmarks=list(benchmarks),
                     problem_sets=problem_sets, eval=how, sampling=_sampling_model(cfg),
                     rollout=cfg.rollout.model_dump(mode="json",
                                                   exclude={"max_new_tokens", "reuse_engine"}),
                     seed=cfg.project.seed)


def probe_key(cfg: PipelineConfig, model_fp: str, trained_fp: str, unseen_fp: str,
              readiness: bool) -> str:
    """The memorisation probe (tasks/probes.py): the eval protocol's samples on both sets;
    with `readiness`, also GRPO's sampling (G, temperature, length) on the unseen one."""
    how = cfg.eval.model_dump(mode="json", exclude={"shards", "benchmarks", "primary_metric",
                                                    "limit", "greedy"})
    extra = {}
    if readiness:
        extra["readiness"] = {"G": cfg.grpo.num_generations,
                              "temperature": getattr(cfg.grpo, "temperature", 1.0),
                              "max_completion_length": cfg.grpo.max_completion_length}
    return stage_key("probe", model=model_fp, trained=trained_fp, unseen=unseen_fp, eval=how,
                     sampling=_sampling_model(cfg), extraction=cfg.rewards.extraction,
                     rollout=cfg.rollout.model_dump(mode="json",
                                                   exclude={"max_new_tokens", "reuse_engine"}),
                     seed=cfg.project.seed, **extra)
