"""One rollout interface for filtering and evaluation:

    backend.sample(prompts, n, params) -> list (per prompt) of list (n) of Completion

`hf` runs transformers `generate` batched across prompts and samples (left padding,
prompts sorted by length so batches pad little); `vllm` (GPU, optional extra) has the
same interface. Training generation is TRL's business, not this module's.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

from grpo_core.progress import Bar


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
    finish_reason: str  # "stop" (eos or </answer>) or "length" (truncated)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class RolloutBackend(Protocol):
    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]: ...


def stop_token_ids(tokenizer) -> list[int]:
    """Generation stops at eos and, when it is a single token, at </answer>."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    close = tokenizer.convert_tokens_to_ids("</answer>")
    if isinstance(close, int) and close != tokenizer.unk_token_id and close not in ids:
        ids.append(close)
    return ids


class HFBackend:
    """transformers generate, batched: (prompt, sample) pairs fill batches of batch_size."""

    def __init__(self, model, tokenizer, batch_size: int = 64, progress: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.progress = progress
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._stop = stop_token_ids(tokenizer)

    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        import torch

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
            kwargs = {"max_new_tokens": params.max_new_tokens, "eos_token_id": self._stop,
                      "pad_token_id": self.tokenizer.pad_token_id}
            if params.greedy:
                kwargs.update(do_sample=False)
            else:
                kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
            with torch.inference_mode():
                out = self.model.generate(**enc, **kwargs)
            new = out[:, enc["input_ids"].shape[1] :]
            for (i, _), ids in zip(batch, new.tolist()):
                results[i].append(self._completion(ids))
            bar.advance(len(batch))
        bar.close()
        if reps == 1 and n > 1:
            results = [[c] * n for c in results]
        return results

    def _completion(self, ids: list[int]) -> Completion:
        pad = self.tokenizer.pad_token_id
        # Strip right padding (sequences that stopped early in a batch).
        while ids and ids[-1] == pad and pad not in self._stop:
            ids = ids[:-1]
        stopped = bool(ids) and ids[-1] in self._stop
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(text=text, num_tokens=len(ids), finish_reason="stop" if stopped else "length")


class VLLMBackend:
    """vLLM offline engine (GPU). Import-guarded: the extra is optional."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, dtype: str = "auto", seed: int = 0,
                 data_parallel_size: int = 1):
        if not vllm_available():
            raise RuntimeError("rollout.backend=vllm needs the gpu extra: pip install -e '.[gpu]'")
        from vllm import LLM

        extra = {"data_parallel_size": data_parallel_size} if data_parallel_size > 1 else {}
        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size,
                       gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                       **extra)
        self.tokenizer = self.llm.get_tokenizer()
        self._stop = stop_token_ids(self.tokenizer)

    def sample(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSP

        sp = VSP(n=n, temperature=max(params.temperature, 0.0), top_p=params.top_p,
                 max_tokens=params.max_new_tokens, seed=params.seed, stop_token_ids=self._stop,
                 include_stop_str_in_output=True)  # keep </answer>, as the hf path does
        outputs = self.llm.generate(prompts, sp, use_tqdm=False)
        return [
            [Completion(o.text, len(o.token_ids), "length" if o.finish_reason == "length" else "stop")
             for o in out.outputs]
            for out in outputs
        ]


def vllm_available() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def resolve_backend_name(name: str) -> str:
    if name == "auto":
        return "vllm" if vllm_available() else "hf"
    return name

