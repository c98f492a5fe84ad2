"""Operating rftflow: vLLM servers (``vllm_server``), the vLLM CPU build, launcher and work-pool templates."""

if __name__ != "rftflow.infra":  # installed as rftflow.infra (pyproject's package-dir), never bare
    raise ImportError(f"import rftflow.infra, not {__name__}: this folder is a part of the rftflow package")
