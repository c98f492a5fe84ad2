"""Ask the registered model a question: its version loads from MLflow as a plain transformers model."""

import sys

import rftflow

model, tokenizer = rftflow.load_registered_model("models:/word-problems/1", "sqlite:///runs/word-problems/mlflow.db")
prompt = (sys.argv[1] if len(sys.argv) > 1 else "Ida has 31 cups and buys 4 more. How many cups?") + " ="
ids = tokenizer(prompt, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
print(prompt, tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
