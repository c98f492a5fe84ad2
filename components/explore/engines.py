"""Rollout engines: prompts → groups of sampled responses with their behaviour log-probs.

``hf``: transformers ``generate`` in batches with a KV cache. Sampling draws from the full
distribution at ``temperature`` (no top-k/top-p), so the recorded log-probs
log softmax(logits / temperature)[token] are the behaviour policy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Rollout:
    prompt_ids: list[int]
    response_ids: list[int]  # up to and including EOS when finished
    logprobs: list[float]  # one per response token
    text: str  # decoded response without special tokens
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool = False) -> list[int]:
    """Prompt token ids as the explorer feeds them: raw, or wrapped in the tokenizer's chat template."""
    if chat_template:
        return list(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        ))
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


class HFRolloutEngine:
    """Batched sampling with a transformers causal LM held in memory (the explorer's copy)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 256,
        chat_template: bool = False,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat_template = chat_template

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, greedy: bool
    ) -> list[Rollout]:
        tok = self.tokenizer
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)  # (N, P) left-padded
        attention = torch.zeros_like(input_ids)  # (N, P)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = 1
        # Sampling sets top_k=0 / top_p=1.0 explicitly: generate() replaces None with its defaults (top_k=50).
        sampling = {} if greedy else {"temperature": temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=not greedy, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True, **sampling,
        )
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
        responses = out.sequences[:, width:]  # (N, S)
        logits = torch.stack(out.logits, dim=1).float()  # (N, S, V)
        scale = 1.0 if greedy else temperature
        logprobs = torch.log_softmax(logits / scale, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)  # (N, S)
        rollouts = []
        for i, prompt in enumerate(prompts):
            ids = responses[i].tolist()
            finished = tok.eos_token_id in ids
            length = ids.index(tok.eos_token_id) + 1 if finished else len(ids)
            rollouts.append(Rollout(
                prompt_ids=list(prompt), response_ids=ids[:length], logprobs=logprobs[i, :length].tolist(),
                text=tok.decode(ids[:length], skip_special_tokens=True), finished=finished,
            ))
        return rollouts

    def generate(
        self, prompts: list[str], *, n: int = 1, max_new_tokens: int = 16, temperature: float = 1.0,
        greedy: bool = False,
    ) -> list[list[Rollout]]:
        """``n`` responses per prompt (a group), sampled, or greedy when ``greedy``."""
        encoded = [self.encode(p) for p in prompts]
        flat = [ids for ids in encoded for _ in range(n)]
        # Sort by prompt length so each batch pads little; restore order after.
        order = sorted(range(len(flat)), key=lambda i: len(flat[i]))
        results: list[Rollout | None] = [None] * len(flat)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start: start + self.batch_size]
            batch = self._generate_batch(
                [flat[i] for i in chunk], max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy
            )
            for i, rollout in zip(chunk, batch):
                results[i] = rollout
        return [results[g * n: (g + 1) * n] for g in range(len(prompts))]  # type: ignore[misc]
