"""The `judge` reward: an LLM behind any OpenAI-compatible endpoint grades each response by a rubric.

The rubric (``reward.judge.rubric``) is a format string over ``question``, ``answer`` (the gold
answer, possibly empty) and ``response``; the response goes in between per-request nonce
delimiters the prompt tells the judge to treat as data, and the judge's reply is read by a stated
grammar (``judge_reply``: ``n/10``, ``n out of 10``, ``Score: n``, a lone integer; with ``guided``
the JSON object ``{"score": n}``, which the request asks the server to produce through vLLM's
``structured_outputs`` regex, so that even a small judge answers in the format). The reward is
the score / ``max_score``.

Each request has a timeout and is retried with exponential back-off; a judge that stays down, keeps
timing out, or answers with no score, a score out of range or two different scores is an
infrastructure failure (``Score(None, reason)``): the row is quarantined, never scored 0 or 1.
A task with pictures (``metadata["images"]``) is judged with them: the request's one user message is
the pictures as ``image_url`` content parts (data URLs of their stored bytes, each checked against its
sha256) and then the prompt as a text part; only ``endpoint: chat`` carries them (``completions``
refuses such a task: ``ValueError``). The pictures come from the task, never from the response, which
is only ever text inside the text part; with pictures, every ``<`` and ``[`` in the response is escaped
(``judge_reply.escape``'s ``tags``), so no placeholder a vision judge reads as an image slot
(``<image>``, ``<|image_pad|>``, ``<start_of_image>``, Pixtral's ``[IMG]`` …) survives in it.
Results are cached by (prompt, pictures, response). The API key is read from the environment variable
``api_key_env`` and sent only as the request's bearer token: it is never logged or stored
(``reward.judge`` holds the variable's name, not the key).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rftflow.components.data.images import data_url, image_digests, task_image_bytes
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.judge_reply import Unreadable, guided_regex, judge_prompt, new_nonce, read_score
from rftflow.components.verify.scores import Score


class JudgeReward:
    name = "judge"

    def __init__(self, settings) -> None:
        if not settings.base_url or not settings.model:
            raise ValueError("reward.judge.base_url and reward.judge.model are needed by the judge reward")
        self.settings = settings
        self._cache: dict[tuple[str, str], Score] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="rftflow-judge")
        self._client = None

    def _http(self):
        import httpx

        if self._client is None:
            key = os.environ.get(self.settings.api_key_env or "", "")
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            self._client = httpx.Client(base_url=self.settings.base_url.rstrip("/"), headers=headers,
                                        timeout=self.settings.timeout_seconds)
        return self._client

    def _request(self, prompt: str, pictures: list[str]) -> str:
        s = self.settings
        guided = {"structured_outputs": {"regex": guided_regex(s.max_score)}} if s.guided else {}
        if s.endpoint == "chat":
            content = [*({"type": "image_url", "image_url": {"url": url}} for url in pictures),
                       {"type": "text", "text": prompt}] if pictures else prompt
            body = {"model": s.model, "messages": [{"role": "user", "content": content}], "temperature": 0,
                    "max_tokens": s.max_tokens, **guided}
            reply = self._http().post("/v1/chat/completions", json=body)
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]["content"] or ""
        body = {"model": s.model, "prompt": prompt, "temperature": 0, "max_tokens": s.max_tokens, **guided}
        reply = self._http().post("/v1/completions", json=body)
        reply.raise_for_status()
        return reply.json()["choices"][0]["text"] or ""

    def _grade(self, prompt: str, pictures: list[str]) -> Score:
        s, last = self.settings, ""
        for attempt in range(s.retries + 1):
            try:
                text = self._request(prompt, pictures)
            except Exception as e:  # noqa: BLE001 — a refused, reset, timed-out or 5xx request: tried again
                last = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                if attempt < s.retries:
                    time.sleep(min(8.0, s.backoff_seconds * 2 ** attempt))
                continue
            try:
                return Score(read_score(text, s.max_score, s.guided) / s.max_score)
            except Unreadable as e:
                return Score(None, f"judge {s.model}'s reply is unreadable ({e}): {text.strip()[:80]!r}")
        return Score(None, f"judge {s.base_url} unavailable after {s.retries + 1} tries ({last})")

    def _one(self, response: str, task: Task) -> Score:
        key = (task.prompt, *image_digests(task.metadata), response)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        pictures = [data_url(data) for data in task_image_bytes(task.metadata)]
        if pictures and self.settings.endpoint != "chat":
            raise ValueError(f"task {task.task_id} has {len(pictures)} image(s): reward.judge.endpoint "
                             f"{self.settings.endpoint} sends no images; use endpoint chat")
        prompt = judge_prompt(self.settings.rubric, task.question, task.answer, response, new_nonce(),
                              tags=bool(pictures))
        score = self._grade(prompt, pictures)
        if score.value is not None:  # a failure is not remembered: the next round asks again
            with self._lock:
                self._cache[key] = score
        return score

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        return list(self._pool.map(self._one, responses, tasks))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
