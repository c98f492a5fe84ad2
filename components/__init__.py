"""The loop's parts, one folder per role (explore, verify, buffer, train, ...); no Prefect import."""

if __name__ != "rftflow.components":  # installed as rftflow.components (pyproject's package-dir), never bare
    raise ImportError(f"import rftflow.components, not {__name__}: this folder is a part of the rftflow package")
