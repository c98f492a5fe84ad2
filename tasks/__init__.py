"""Prefect tasks: thin wrappers, one component call each, small return values (metric dicts, keys).

Tasks that receive the ``Campaign`` (models inside) use ``cache_policy=NO_CACHE`` so Prefect
never pickles or hashes it.
"""

if __name__ != "rftflow.tasks":  # installed as rftflow.tasks (pyproject's package-dir), never bare
    raise ImportError(f"import rftflow.tasks, not {__name__}: this folder is a part of the rftflow package")
