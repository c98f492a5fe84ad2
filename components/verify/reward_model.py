"""The `reward_model` reward: a Hugging Face sequence-classification model scores (prompt, response).

The model (``reward.reward_model.path``, a local directory) reads the task's prompt and the
response as a text pair; with one output the reward is sigmoid(logit), with two or more the
probability of the last label ("good"). Loaded on first use, on the CPU, in eval mode, in batches
of ``batch_size``. A model that fails to load or to run is an infrastructure failure: every row it
should have scored gets ``Score(None, reason)`` (quarantined), never a 0.
"""

from __future__ import annotations

import threading

from rftflow.components.data.tasksets import Task
from rftflow.components.verify.scores import Score


class RewardModelReward:
    name = "reward_model"

    def __init__(self, settings) -> None:
        if not settings.path:
            raise ValueError("reward.reward_model.path is needed by the reward_model reward")
        self.settings = settings
        self._model = self._tokenizer = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if self._model is None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.settings.path)
            self._model = AutoModelForSequenceClassification.from_pretrained(self.settings.path).eval()

    def _scores(self, prompts: list[str], responses: list[str]) -> list[float]:
        import torch

        self._load()
        out: list[float] = []
        size = self.settings.batch_size
        for start in range(0, len(prompts), size):
            batch = self._tokenizer(prompts[start:start + size], responses[start:start + size], padding=True,
                                    truncation=True, max_length=self.settings.max_length, return_tensors="pt")
            with torch.no_grad():
                logits = self._model(**batch).logits.float()
            probs = torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else torch.softmax(logits, -1)[:, -1]
            out.extend(probs.tolist())
        return out

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        try:
            with self._lock:  # one model, one batch at a time
                values = self._scores([t.prompt for t in tasks], responses)
        except Exception as e:  # noqa: BLE001 — a model that cannot load or run: no row is scored
            reason = f"reward model {self.settings.path} failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            return [Score(None, reason) for _ in responses]
        return [Score(v) for v in values]
