"""The campaign configs that ship with rftflow (package data): ``rftflow run arith-grpo`` or
``rftflow.load_config("arith-grpo")`` finds one by name from any directory."""
