"""Rollout engines: prompts → groups of sampled responses with their behaviour log-probs.

Every engine has ``encode(prompt, images=)``, ``generate_ids(prompt_ids, images=, n=, max_new_tokens=,
temperature=, greedy=)`` → groups of ``Rollout`` (token ids and each sampled token's log-prob; token in, token
out, so a multi-turn workflow extends a context without re-tokenising it), ``generate(prompts, images=, …)``
(the same on the prompts' encodings; one method for all, ``PromptEngine``'s), and
``load_state_dict(weights)``, which weight sync calls with the trainer's newest weights (and, where
the engine holds the weights itself, ``holds(weights, names)``, which the sync check asks, and
``weights_digest(names)``, which a failed check reports).

- ``hf``: a transformers model in this process, a batched decode loop with a KV cache; a
  vision-language model (``models.load_processor``) samples with each prompt's images (``images``:
  a list of PIL images per prompt), whose pixels go into the prefill.
- ``openai``: OpenAI-compatible completions servers (``vllm serve``; one, or a pool of replicas), over HTTP;
  a prompt with images goes to ``/v1/chat/completions`` with them as ``image_url`` content parts.
- ``vllm``: vLLM in this process, on a GPU (a LoRA policy's adapter loaded as vLLM's LoRA).

The ``vllm`` engine takes no images yet (``ValueError`` naming the engine).

Sampling draws from the full distribution at ``temperature`` (no top-k/top-p), so the recorded
log-probs log softmax(logits / temperature)[token] are the behaviour policy's; a response ends at
any of ``stop_token_ids`` (the tokenizer's EOS and the generation config's), as ``generate`` ends it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from rftflow.components.data.images import data_url, png_bytes, pixel_inputs, suppressed_ids
from rftflow.components.data.prompts import encode_image_prompt, encode_prompt, image_block
from rftflow.components.explore.decode import decode_steps, forget_fused, prefill
from rftflow.components.explore.server_pool import Replica, ServerPool


ADAPTER_NAME = "rftflow-policy"  # the name a server that loads LoRA adapters serves the policy's under
# the chat template an image prompt is sent with: its text parts as they are, so the server tokenises the
# prompt the engine encoded (its image placeholders in place), whatever the model's own template
VERBATIM_TEMPLATE = "{% for m in messages %}{% for p in m['content'] %}{% if p['type'] == 'text' %}" \
                    "{{ p['text'] }}{% endif %}{% endfor %}{% endfor %}"


@dataclass
class Rollout:
    prompt_ids: list[int]
    response_ids: list[int]  # up to and including EOS when finished
    logprobs: list[float]  # one per response token
    text: str  # decoded response without special tokens
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


class PromptEngine:
    """What every engine shares: ``generate`` encodes each prompt with its pictures (the engine's
    ``encode``) and samples on the ids (its ``generate_ids``)."""

    def generate(self, prompts: list[str], images: Sequence[Sequence] | None = None, **sampling) -> list[list[Rollout]]:
        """``generate_ids`` on the prompts' encodings (``images``: each prompt's, or None)."""
        images = images or [()] * len(prompts)
        return self.generate_ids([self.encode(p, i) for p, i in zip(prompts, images)],
                                 images=images if any(images) else None, **sampling)


class HFRolloutEngine(PromptEngine):
    """Batched sampling with a transformers causal LM held in memory (the explorer's copy)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 256,
        chat_template: bool = False,
        lean_steps: bool = True,
        processor=None,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(getattr(model, "generation_config", None), tokenizer)
        self.batch_size = batch_size
        self.chat_template = chat_template
        self.lean_steps = lean_steps  # False: every step through the model's own forward (``decode``)
        self.processor = processor  # a vision-language model's (``models.load_processor``); None: text only
        self.suppressed = suppressed_ids(processor) if processor is not None else []  # never sampled

    def encode(self, prompt: str, images: Sequence = ()) -> list[int]:
        """The prompt's token ids; with ``images`` (PIL images), through the processor: each image's
        placeholder expanded into its tokens (``encode_image_prompt``)."""
        if not images:
            return encode_prompt(self.tokenizer, prompt, self.chat_template)
        return encode_image_prompt(self._processor(), prompt, images, self.chat_template)

    def _processor(self):
        if self.processor is None:
            raise ValueError(f"{type(self.model).__name__} is a text model: it takes no images (model.path must be a "
                             "vision-language model, e.g. builtin:tiny-vlm)")
        return self.processor

    @torch.no_grad()
    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` into the model's own tensors, in place (the model's ``load_state_dict``,
        which walks every module, for any other set of names: it names what is missing or extra)."""
        own = self._tensors
        if weights.keys() != own.keys():
            self.model.load_state_dict(weights)
            return
        for name, value in weights.items():  # in place: no state-dict bookkeeping of load_state_dict
            own[name].copy_(value)

    @functools.cached_property
    def _tensors(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict(keep_vars=True)

    def holds(self, weights: Mapping[str, torch.Tensor], names: Iterable[str]) -> bool:
        """Whether this engine samples with exactly the named ``weights`` (``same_bits``, each tensor
        where this engine holds it: on a GPU, no copy to the host)."""
        own = self._tensors
        return all(same_bits(own[name], weights[name]) for name in names)

    def weights_digest(self, names: list[str]) -> str:
        """sha256 of the named tensors this engine samples with (``weights_digest``)."""
        return weights_digest(self._tensors, names)

    @torch.inference_mode()  # no autograd bookkeeping at all (no_grad still tracks versions)
    def _generate_batch(
        self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float, greedy: bool,
        images: Sequence[Sequence] | None = None,
    ) -> list[Rollout]:
        """``n`` responses to each of ``prompts`` (G prompts → G·n rollouts, a group's together);
        ``images``: each prompt's, whose pixels the prefill reads (the K/V after it hold them).

        A decode loop of its own rather than ``model.generate``, for three things ``generate`` does
        not do: each prompt is encoded once and its K/V shared by its group; a row that has emitted
        EOS leaves the batch and the cache instead of being computed until the longest row ends; only the
        sampled token's log-prob is kept, not every step's (N, V) logits. The steps after the
        prefill are ``components.explore.decode``'s (lean for the Llama family). Sampling is
        ``generate``'s: a multinomial draw from softmax(logits / temperature), or the argmax when
        ``greedy``.
        """
        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        pixels = pixel_inputs(self._processor().image_processor, images) if images else {}
        last, cache, attention, position = prefill(model, prompts, tok.pad_token_id,
                                                   {k: v.to(device) for k, v in pixels.items()})
        steps = decode_steps(model, cache, attention, n, max_new_tokens, lean=self.lean_steps)
        logits = last.repeat_interleave(n, 0)  # (N, V), N = G·n
        position = position.repeat_interleave(n, 0)  # (N,)
        rows, stops = len(prompts) * n, torch.tensor(sorted(self.stop_ids), device=device)
        tokens = torch.full((rows, max_new_tokens), tok.pad_token_id, dtype=torch.long)  # (N, S)
        logprobs = torch.zeros(rows, max_new_tokens)  # (N, S)
        lengths = torch.full((rows,), max_new_tokens, dtype=torch.long)  # (N,)
        active = torch.arange(rows)  # rows still generating, in the cache's order
        for step in range(max_new_tokens):
            logits = logits.float() / (1.0 if greedy else temperature)  # (A, V)
            if self.suppressed:
                logits[:, self.suppressed] = torch.finfo(logits.dtype).min
            logp = torch.log_softmax(logits, dim=-1)  # (A, V)
            chosen = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)  # (A,)
            tokens[active, step] = chosen.cpu()
            logprobs[active, step] = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).cpu()
            ended = torch.isin(chosen, stops).cpu()  # (A,)
            lengths[active[ended]] = step + 1
            if step == max_new_tokens - 1 or bool(ended.all()):
                break
            if bool(ended.any()):  # finished rows leave the batch
                keep = (~ended).nonzero().squeeze(-1)
                active, on_device = active[keep], keep.to(device)
                chosen, position = chosen[on_device], position[on_device]
                steps.keep(on_device)
            position = position + 1
            logits = steps.step(chosen, position)
        rollouts = []
        for i in range(rows):
            ids = tokens[i, :int(lengths[i])].tolist()
            rollouts.append(Rollout(
                prompt_ids=list(prompts[i // n]), response_ids=ids, logprobs=logprobs[i, :len(ids)].tolist(),
                text=tok.decode(ids, skip_special_tokens=True), finished=ids[-1] in self.stop_ids,
            ))
        return rollouts

    def generate_ids(
        self, encoded: list[list[int]], *, images: Sequence[Sequence] | None = None, n: int = 1,
        max_new_tokens: int = 16, temperature: float = 1.0, greedy: bool = False,
    ) -> list[list[Rollout]]:
        """``n`` responses per prompt of token ids (a group), sampled, or greedy when ``greedy``; at
        most ``batch_size`` rows (and at least one group) per batch. Token in, token out: a
        rollout's ``prompt_ids`` are the ids given, its ``response_ids`` the ids sampled.
        ``images``: each prompt's images (PIL), whose tokens its ids hold (``encode``), or None."""
        # Sort by prompt length so each batch pads little; restore order after.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        per_batch = max(1, self.batch_size // n)
        groups: list[list[Rollout] | None] = [None] * len(encoded)
        for start in range(0, len(order), per_batch):
            chunk = order[start: start + per_batch]
            batch = self._generate_batch([encoded[i] for i in chunk], n, max_new_tokens=max_new_tokens,
                                         temperature=temperature, greedy=greedy,
                                         images=[images[i] for i in chunk] if images else None)
            for j, i in enumerate(chunk):
                groups[i] = batch[j * n: (j + 1) * n]
        return groups  # type: ignore[return-value]


class OpenAIRolloutEngine(PromptEngine):
    """Sampling from OpenAI-compatible completions servers (``vllm serve`` …) that return token ids
    and log-probs: prompts go as token ids (``/v1/completions`` with ``prompt`` = ids), responses
    come back as ids with each sampled token's log-prob (``return_token_ids`` and ``logprobs=0``,
    vLLM's extensions), so rows are the same as the ``hf`` engine's.

    ``base_urls`` are one server or a pool of replicas (``components.explore.server_pool``):
    requests go to the least-loaded live replica, a replica that dies mid-round has its requests
    answered by the others, and a sync reaches every live replica (and one that comes back).

    After a sync the servers load the new weights in place (``load_state_dict``): they are written
    to a directory each server reads, so they run on this machine (or see its ``/tmp``), with
    ``VLLM_SERVER_DEV_MODE=1`` for vLLM's ``/collective_rpc`` endpoint. A LoRA policy's adapter is
    loaded instead of merged weights where the servers can (``load_adapter``). The newest synced
    files stay until the next sync replaces them: a replica that comes back reads them.

    A prompt with images (a vision-language model's: ``processor``) cannot go as token ids: it goes
    to ``/v1/chat/completions``, one request per prompt, as one user message of the images
    (``image_url`` parts, PNG data URLs) and the prompt's text with one image placeholder per image,
    rendered by ``VERBATIM_TEMPLATE`` (the server must take a request's chat template: vLLM's
    ``--trust-request-chat-template``). The server's ``prompt_token_ids`` must be the engine's ids
    (``ValueError`` where they are not, so a row never holds a context the server did not sample from);
    the sampled ids and log-probs come back as from ``/v1/completions``.
    """

    def __init__(self, base_urls: str | Sequence[str], served_model: str, tokenizer: PreTrainedTokenizerBase, *,
                 batch_size: int = 256, chat_template: bool = False, timeout: float = 600.0, processor=None):
        self.served_model, self.tokenizer, self.processor = served_model, tokenizer, processor
        # never sampled (a vision model's image placeholder), as the hf engine: a bias of -100 (vLLM's
        # floor), its share of the distribution e^-100 of the others', nothing in float32
        self.never = {str(i): -100 for i in suppressed_ids(processor)} if processor is not None else {}
        self.batch_size, self.chat_template = batch_size, chat_template
        self.pool = ServerPool([base_urls] if isinstance(base_urls, str) else list(base_urls), timeout)
        self.only: Replica | None = None  # a view pinned to one replica (``pinned``) asks it alone
        self.adapters: bool | None = None  # whether the servers load LoRA adapters at run time (None: not asked yet)
        self._synced_files: weakref.finalize | None = None  # removes the directory of the newest sync

    @property
    def base_url(self) -> str:
        """The replica a pinned view asks, else the first."""
        return (self.only or self.pool.replicas[0]).url

    def pinned(self) -> list[OpenAIRolloutEngine]:
        """One view of this engine per live replica, each asking only it (a sync check probes each)."""
        views = []
        for replica in self.pool.live:
            view = copy.copy(self)
            view.only = replica
            views.append(view)
        return views

    def encode(self, prompt: str, images: Sequence = ()) -> list[int]:
        """The prompt's token ids (with ``images``: the processor's, as the ``hf`` engine's ``encode``)."""
        if not images:
            return encode_prompt(self.tokenizer, prompt, self.chat_template)
        if self.processor is None:
            raise ValueError(f"the openai engine's model {self.served_model} is a text model: it takes no images "
                             "(model.path must be a vision-language model, e.g. builtin:tiny-vlm)")
        return encode_image_prompt(self.processor, prompt, images, self.chat_template)

    def generate_ids(
        self, encoded: list[list[int]], *, images: Sequence[Sequence] | None = None, n: int = 1,
        max_new_tokens: int = 16, temperature: float = 1.0, greedy: bool = False,
    ) -> list[list[Rollout]]:
        """``n`` responses per prompt of token ids (a group), sampled at ``temperature`` from the
        full distribution (top_k/top_p off), or greedy when ``greedy``. The servers get the ids,
        not text, and return ids: nothing is re-tokenised. The prompts are cut into requests
        (``ServerPool.requests_for``) that the pool spreads over its replicas. ``images``: each
        prompt's (PIL), whose tokens its ids hold; such a prompt is one chat request (``_with_images``)."""
        if images and any(images):
            return self._with_images(encoded, images, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                     greedy=greedy)
        per_request = self.pool.requests_for(len(encoded), self.batch_size // n)
        chunks = [encoded[start:start + per_request] for start in range(0, len(encoded), per_request)]
        model = ADAPTER_NAME if self.adapters else self.served_model
        bodies = [{"model": model, "prompt": chunk, "n": n, "max_tokens": max_new_tokens,
                   "temperature": 0.0 if greedy else temperature, "top_p": 1.0, "top_k": -1, "logprobs": 0,
                   "return_token_ids": True, "skip_special_tokens": True,
                   **({"logit_bias": self.never} if self.never else {})} for chunk in chunks]
        groups: list[list[Rollout]] = []
        for chunk, answer in zip(chunks, self.pool.complete("/v1/completions", bodies, self.only)):
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            for g, prompt in enumerate(chunk):
                groups.append([self._rollout(prompt, c) for c in choices[g * n:(g + 1) * n]])
        return groups

    def _with_images(self, encoded: list[list[int]], images: Sequence[Sequence], *, n: int, max_new_tokens: int,
                     temperature: float, greedy: bool) -> list[list[Rollout]]:
        """``generate_ids`` of prompts with images: one ``/v1/chat/completions`` request each (a
        prompt without images among them too), the server's prompt ids checked against the engine's."""
        model = ADAPTER_NAME if self.adapters else self.served_model
        sampling = {"model": model, "n": n, "max_tokens": max_new_tokens, "temperature": 0.0 if greedy else temperature,
                    "top_p": 1.0, "top_k": -1, "logprobs": True, "top_logprobs": 0, "return_token_ids": True,
                    "skip_special_tokens": True, "chat_template": VERBATIM_TEMPLATE, "add_generation_prompt": False,
                    "add_special_tokens": False, **({"logit_bias": self.never} if self.never else {})}
        bodies = [{**sampling, "messages": [{"role": "user", "content": self._content(ids, list(pictures))}]}
                  for ids, pictures in zip(encoded, images)]
        groups = []
        for ids, answer in zip(encoded, self.pool.complete("/v1/chat/completions", bodies, self.only)):
            served = answer.get("prompt_token_ids") or []
            if served != ids:
                at = next((i for i, (a, b) in enumerate(zip(served, ids)) if a != b), min(len(served), len(ids)))
                raise ValueError(f"the server tokenised an image prompt otherwise than the engine (first at token "
                                 f"{at} of {len(ids)}: {served[at:at + 4]} for {ids[at:at + 4]}): is it serving "
                                 f"{self.served_model} with the model's own processor?")
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            groups.append([self._rollout(ids, c, [float(t["logprob"]) for t in c["logprobs"]["content"]])
                           for c in choices])
        return groups

    def _content(self, ids: list[int], pictures: list) -> list[dict]:
        """A prompt's chat content: its images as ``image_url`` parts (PNG data URLs), then its text,
        each image's expanded tokens in ``ids`` folded back into the one placeholder the server expands
        (``ValueError`` where ``ids`` do not hold an image's tokens in order)."""
        if not pictures:
            return [{"type": "text", "text": self.tokenizer.decode(ids, skip_special_tokens=False)}]
        if self.processor is None:
            self.encode("", pictures)  # the text-model error
        folded, at = [], 0
        for k, picture in enumerate(pictures):
            block = image_block(self.processor, picture.size)
            found = next((i for i in range(at, len(ids) - len(block) + 1) if ids[i:i + len(block)] == block), None)
            if found is None:
                raise ValueError(f"the prompt's token ids do not hold image {k}'s {len(block)} tokens after token {at}")
            folded += [*ids[at:found], self.processor.image_token_id]
            at = found + len(block)
        text = self.processor.tokenizer.decode(folded + ids[at:], skip_special_tokens=False)
        return [*({"type": "image_url", "image_url": {"url": data_url(png_bytes(p))}} for p in pictures),
                {"type": "text", "text": text}]

    def _rollout(self, prompt: list[int], choice: dict, logprobs: list[float] | None = None) -> Rollout:
        """A choice of ``/v1/completions`` (or of chat completions, its ``logprobs`` read by the caller)."""
        ids = list(choice["token_ids"])
        if logprobs is None:
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        finished = choice["finish_reason"] == "stop"
        # the server leaves the stop token out of token_ids: the tokenizer's EOS, or the one of the
        # generation config's it names as ``stop_reason``
        stop_reason = choice.get("stop_reason")
        eos = stop_reason if isinstance(stop_reason, int) else self.tokenizer.eos_token_id
        if finished and (not ids or ids[-1] != eos):
            ids.append(eos)
            logprobs.append(0.0 if len(logprobs) < len(ids) - 1 else logprobs[-1])
        return Rollout(prompt_ids=list(prompt), response_ids=ids, logprobs=logprobs[:len(ids)],
                       text=self.tokenizer.decode(ids, skip_special_tokens=True), finished=finished)

    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        """Every live server reloads its weights, in place: they are written as safetensors to a
        directory it reads (``/collective_rpc`` ``reload_weights``; servers run with ``VLLM_SERVER_DEV_MODE=1``)."""
        out = Path(tempfile.mkdtemp(prefix="rftflow-weights-"))
        save_file(cpu_copies(weights), str(out / "model.safetensors"))
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(out)}}
        try:
            self.pool.sync(lambda replica: _ok(replica, replica.post("/collective_rpc", body), "/collective_rpc"))
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        self._synced_files = newest_files(self, out, self._synced_files)

    def load_adapter(self, write: Callable[[Path], None]) -> bool:
        """A LoRA policy's sync where the servers load adapters at run time (vLLM with
        ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): the adapter ``write(dir)``
        writes is loaded in place as ``ADAPTER_NAME`` on every live server, and completions are
        asked of it from then on. False, nothing loaded, where the first server has no such
        endpoint (the servers of a pool are alike): the caller reloads merged weights instead."""
        if self.adapters is False:
            return False
        out = Path(tempfile.mkdtemp(prefix="rftflow-adapter-"))
        write(out)
        body = {"lora_name": ADAPTER_NAME, "lora_path": str(out), "load_inplace": True}

        def load(replica: Replica) -> None:
            response = replica.post("/v1/load_lora_adapter", body)
            if response.status_code == 404 and self.adapters is None:  # no run-time LoRA loading on these servers
                raise _NoAdapters()
            _ok(replica, response, "/v1/load_lora_adapter")

        try:
            self.pool.sync(load)
        except _NoAdapters:
            shutil.rmtree(out, ignore_errors=True)
            self.adapters = False
            return False
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        self._synced_files = newest_files(self, out, self._synced_files)
        self.adapters = True
        return True


class _NoAdapters(Exception):
    """The server answered 404 to ``/v1/load_lora_adapter``."""


def _ok(replica: Replica, response, path: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{replica.url}{path}: HTTP {response.status_code}: {response.text[:300]}")


class VLLMRolloutEngine(PromptEngine):
    """vLLM in this process, on a GPU: ``vllm.LLM`` over the model directory; after a sync the
    new weights are loaded in place (``reload_weights`` on the workers), no restart. Prompts go as
    token ids; each sampled token's log-prob comes back with it (``logprobs=0``).

    With ``lora`` (a LoRA campaign's ``LoraConfig``) vLLM runs with LoRA enabled and a sync loads
    the trainer's adapter (``load_adapter``) instead of merged weights: each sync is a new
    ``LoRARequest`` (a new id, so vLLM reads the new files), and responses are sampled with the
    newest one; before the first sync, with the base. ``eager``: vLLM's ``enforce_eager`` (no
    torch.compile, no CUDA graphs: a quicker start, a slower decode)."""

    def __init__(self, model_dir: str, tokenizer: PreTrainedTokenizerBase, *, chat_template: bool = False,
                 dtype: str = "auto", gpu_memory_utilization: float = 0.3, seed: int = 0, lora=None,
                 eager: bool = False):
        from vllm import LLM  # the `vllm` extra, on a GPU machine

        self.tokenizer, self.chat_template = tokenizer, chat_template
        adapters = {} if lora is None else {"enable_lora": True, "max_lora_rank": lora.rank, "max_loras": 1}
        self.llm = LLM(model=str(model_dir), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                       enforce_eager=eager, seed=seed, **adapters)
        self.lora, self.lora_request = lora is not None, None  # the newest synced adapter's request
        self._adapter_files: weakref.finalize | None = None  # removes the newest adapter's directory
        try:  # vLLM stops where the model's generation config says, as the hf engine does
            generation = GenerationConfig.from_pretrained(model_dir)
        except OSError:
            generation = None
        self.stop_ids = stop_token_ids(generation, tokenizer)

    def encode(self, prompt: str, images: Sequence = ()) -> list[int]:
        text_only("vllm", images)
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def generate_ids(
        self, encoded: list[list[int]], *, images: Sequence[Sequence] | None = None, n: int = 1,
        max_new_tokens: int = 16, temperature: float = 1.0, greedy: bool = False,
    ) -> list[list[Rollout]]:
        from vllm import SamplingParams, TokensPrompt

        text_only("vllm", images)

        params = SamplingParams(n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                                top_p=1.0, top_k=-1, logprobs=0)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in encoded], params, use_tqdm=False,
                                    lora_request=self.lora_request)
        groups = []
        for ids, out in zip(encoded, outputs):
            group = []
            for c in out.outputs:
                response = list(c.token_ids)
                logprobs = [lp[t].logprob for t, lp in zip(response, c.logprobs)]
                group.append(Rollout(prompt_ids=ids, response_ids=response, logprobs=logprobs,
                                     text=self.tokenizer.decode(response, skip_special_tokens=True),
                                     finished=c.finish_reason == "stop" and bool(response)
                                     and response[-1] in self.stop_ids))
            groups.append(group)
        return groups

    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        """Newer weights into the running engine, in place (``reload_weights`` on its workers): the
        tensors themselves when the model runs in this process and vLLM takes them
        (``_reloads_tensors``), else through a safetensors file the workers read."""
        if _reloads_tensors():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            return
        with tempfile.TemporaryDirectory(prefix="rftflow-weights-") as out:
            save_file(cpu_copies(weights), str(Path(out) / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": out})

    def load_adapter(self, write: Callable[[Path], None]) -> bool:
        """A LoRA policy's sync: the adapter ``write(dir)`` writes becomes the one responses are
        sampled with (a new ``LoRARequest``; vLLM reads its files at the next ``generate``). False,
        nothing loaded, when the engine runs without LoRA: the caller reloads merged weights."""
        if not self.lora:
            return False
        from vllm.lora.request import LoRARequest

        out = Path(tempfile.mkdtemp(prefix="rftflow-adapter-"))
        write(out)
        number = self.lora_request.lora_int_id + 1 if self.lora_request else 1
        self.lora_request = LoRARequest(ADAPTER_NAME, number, str(out))
        self._adapter_files = newest_files(self, out, self._adapter_files)  # vLLM read the one before
        return True


def text_only(engine: str, images) -> None:
    """``ValueError`` when an engine that samples text prompts only is given images."""
    if images and any(images):
        raise ValueError(f"the {engine} engine takes no images yet: sample a vision taskset with explorer.engine hf")


@functools.cache
def _reloads_tensors() -> bool:
    """Whether vLLM's model runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no copy of
    the weights crosses a process boundary) and its ``reload_weights`` takes tensors
    (``weights_iterator``; older releases read a path only, or lay their runner out otherwise)."""
    import inspect

    from vllm import envs

    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        takes = "weights_iterator" in inspect.signature(GPUModelRunner.reload_weights).parameters
    except (ImportError, AttributeError):
        takes = False
    return takes and not envs.VLLM_ENABLE_V1_MULTIPROCESSING


def newest_files(owner, out: Path, before: weakref.finalize | None) -> weakref.finalize:
    """``out`` is ``owner``'s newest synced directory: the one ``before`` removes goes now, ``out``
    when ``owner`` does (the returned finalizer, for the next call)."""
    if before is not None:
        before()
    return weakref.finalize(owner, shutil.rmtree, str(out), True)


def stop_token_ids(generation_config, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids a response ends at: the tokenizer's EOS and the ``eos_token_id`` (one or a list) of
    the model's generation config (None: none), as transformers' ``generate``, vLLM and TRL stop
    (an instruct model's config may list its end-of-turn token beside the base model's end of text)."""
    listed = getattr(generation_config, "eos_token_id", None)
    listed = [] if listed is None else [listed] if isinstance(listed, int) else list(listed)
    return frozenset([tokenizer.eos_token_id, *listed])


@torch.no_grad()
def weights_digest(weights: Mapping[str, torch.Tensor], names: Iterable[str]) -> str:
    """sha256 over ``names`` (sorted) of ``weights``: each name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in sorted(names):
        tensor = weights[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().data if tensor.numel() else b"")  # the bytes, not a copy
    return digest.hexdigest()


_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(mine: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``other`` has ``mine``'s dtype, shape and bytes, compared on ``mine``'s device as
    integers of the element's size (the bytes that ``weights_digest`` hashes, at a fraction of its
    cost: no hashing, and on a GPU no copy to the host)."""
    if mine.dtype != other.dtype or mine.shape != other.shape:
        return False
    bits = _SAME_SIZE_INTS[mine.element_size()]
    return torch.equal(mine.detach().reshape(-1).view(bits), other.detach().to(mine.device).reshape(-1).view(bits))


def cpu_copies(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies (safetensors refuses tensors that share memory, as tied embeddings do)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}


def make_engine(explorer, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_config, seed: int = 0):
    """The rollout engine ``explorer.engine`` names (``explorer``: an ``ExplorerConfig``,
    ``model_config``: a ``ModelConfig``): ``hf`` over ``model`` (the explorer's copy), ``openai`` at
    ``explorer.base_url`` (one URL or a list: a pool of replicas), ``vllm`` over the model directory."""
    chat_template = model_config.chat_template
    if explorer.engine == "openai":
        from rftflow.components.explore.models import load_processor

        return OpenAIRolloutEngine(explorer.base_url, explorer.served_model, tokenizer,
                                   batch_size=explorer.batch_size, chat_template=chat_template,
                                   processor=load_processor(model_config.path,
                                                            allow_download=model_config.allow_download))
    if explorer.engine == "vllm":
        from rftflow.components.explore.models import model_directory

        model_dir = model_directory(model_config.path, allow_download=model_config.allow_download)
        # the trainer's dtype, so the sync check compares like with like ("auto" would sample a float32
        # model in bfloat16); LoRA: vLLM's own choice, its LoRA kernels take float16 or bfloat16 only
        dtype = "auto" if model_config.lora else model_config.dtype
        return VLLMRolloutEngine(model_dir, tokenizer, chat_template=chat_template, seed=seed, dtype=dtype,
                                 lora=model_config.lora, eager=explorer.vllm_eager)
    from rftflow.components.explore.models import load_processor

    processor = load_processor(model_config.path, allow_download=model_config.allow_download)
    return HFRolloutEngine(model, tokenizer, batch_size=explorer.batch_size, chat_template=chat_template,
                           processor=processor)


@contextmanager
def decoding(model: PreTrainedModel, explorer, tokenizer: PreTrainedTokenizerBase, model_config) -> Iterator:
    """An ``hf`` engine over ``model`` (a trainer's own weights, no sync), decoding as the explorer's
    ``hf`` engine does; afterwards the model's fused decode weights (a copy of it) are dropped and its
    train mode is as it was."""
    training = model.training
    engine = make_engine(explorer.model_copy(update={"engine": "hf"}), model, tokenizer, model_config)
    try:
        yield engine
    finally:
        forget_fused(model)
        model.train(training)
