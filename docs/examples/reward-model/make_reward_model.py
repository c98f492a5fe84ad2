"""Builds a small local reward model for trying the `reward_model` reward on a laptop: a 2-layer
sequence classifier (transformers' Qwen2 with builtin:tiny's character tokenizer) trained for a
minute on word problems' right answers and wrong ones (the question's first number copied), saved
as a Hugging Face directory. Its score is a sigmoid: `reward.correct_at` (0.5 by default for
`reward_model`) decides what counts as correct.

    python make_reward_model.py rm        # then reward.reward_model.path: rm
"""

import random
import sys

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

from rftflow.components.explore.models import model_directory

out = sys.argv[1] if len(sys.argv) > 1 else "rm"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
torch.set_num_threads(1)
torch.manual_seed(0)
rng = random.Random(0)
tokenizer = AutoTokenizer.from_pretrained(model_directory("builtin:tiny"))
tokenizer.padding_side = "left"
config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, num_labels=1,
                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
model = Qwen2ForSequenceClassification(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)


def pair() -> tuple[str, str, float]:
    """A word problem's prompt and a right (1) or wrong (0) answer."""
    a, b = rng.randint(10, 59), rng.randint(1, 9)
    right = rng.random() < 0.5
    answer = a + b if right else a  # the question's first number copied: a common mistake
    return f"Ann has {a} pens and buys {b} more. How many pens? =", str(answer), float(right)


for step in range(steps):
    batch = [pair() for _ in range(32)]
    inputs = tokenizer([p for p, _, _ in batch], [r for _, r, _ in batch], return_tensors="pt", padding=True)
    logits = model(**inputs).logits.squeeze(-1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([y for _, _, y in batch]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
model.save_pretrained(out)
tokenizer.save_pretrained(out)
print(f"{out}: reward model after {steps} steps, loss {loss.item():.3f}")
