"""Batched decoding with the KV cache in which a row that stopped leaves the batch.

    decode(model, input_ids, attention_mask, max_new_tokens, pick, stop) -> generated ids per row

transformers' `generate` keeps every row of a batch in every forward pass until the
longest one ends (a finished row is fed padding): a batch whose rows mostly stop after 15
tokens but one runs to 64 costs 64 full-batch steps. Here each step runs only the rows
still going: when rows stop, their entries leave the input, the attention mask, the
position ids and the KV cache (DynamicCache.batch_select_indices), so a step costs what
its live rows cost. Per row the arithmetic is generate's (left-padded prompt, position
ids from the mask, one token at a time over the cache), so greedy decoding picks the
same tokens (tests/test_decode.py).

`pick(logits, rows)` chooses the next token of each live row: `logits` (live rows x
vocabulary, float32) and `rows`, their indices in the original batch (a per-row sampler
such as grpo_core.generation.sampling's Gumbel one needs to know whose row is whose).
`stop(row, ids)` says whether a row is done after appending its newest token (eos, a
stop token, a stop string in the text)."""
from __future__ import annotations

from collections.abc import Callable

import torch

Pick = Callable[[torch.Tensor, list[int]], torch.Tensor]
Stop = Callable[[int, list[int]], bool]


def greedy_pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    return logits.argmax(-1)


def sampling_pick(temperature: float, top_p: float) -> Pick:
    """Sample from softmax(logits / T) within the top_p nucleus (top_k off), drawing from
    torch's global generator (seed it before decoding)."""
    def pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        logits = logits / temperature
        if top_p < 1.0:
            probs, order = torch.sort(torch.softmax(logits, -1), descending=True)
            outside = probs.cumsum(-1) - probs >= top_p  # keeps at least the top token
            logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside),
                                        float("-inf"))
        return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)

    return pick


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
           pick: Pick, stop: Stop) -> list[list[int]]:
    """The tokens generated for each row of a left-padded batch (module doc), each list
    ending at the token that stopped it or after max_new_tokens."""
    import inspect

    from transformers import DynamicCache

    # transformers >= 5.2x names the cache argument `cache` (past_key_values warns there)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    n = input_ids.shape[0]
    out: list[list[int]] = [[] for _ in range(n)]
    live = list(range(n))  # original row of each position in the shrinking batch
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    step_ids, step_pos = input_ids, positions
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                           use_cache=True, logits_to_keep=1, **{cache_arg: cache}).logits
            tokens = pick(logits[:, -1, :].float(), live).tolist()
            keep = []
            for k, (row, tok) in enumerate(zip(live, tokens)):
                out[row].append(tok)
                if not stop(row, out[row]):
                    keep.append(k)
            if not keep:
                break
            last_pos = step_pos[:, -1:] + 1
            next_ids = torch.tensor(tokens, dtype=input_ids.dtype, device=input_ids.device)[:, None]
            if len(keep) < len(live):  # finished rows leave the batch, cache included
                idx = torch.tensor(keep, device=input_ids.device)
                cache.batch_select_indices(idx)
                mask, last_pos, next_ids = mask[idx], last_pos[idx], next_ids[idx]
                live = [live[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=-1)
            step_ids, step_pos = next_ids, last_pos
    return out
