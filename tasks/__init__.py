"""Prefect tasks: thin wrappers, one component call each, small return values (metric dicts, keys).

Tasks that receive the ``Campaign`` (models inside) use ``cache_policy=NO_CACHE`` so Prefect
never pickles or hashes it.
"""
