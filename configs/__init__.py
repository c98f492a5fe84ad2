"""The campaign configs that ship with rftflow (package data): ``rftflow run arith-grpo`` or
``rftflow.load_config("arith-grpo")`` finds one by name from any directory."""

if __name__ != "rftflow.configs":  # installed as rftflow.configs (pyproject's package-dir), never bare
    raise ImportError(f"import rftflow.configs, not {__name__}: this folder is a part of the rftflow package")
