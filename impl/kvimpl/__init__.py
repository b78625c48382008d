"""Optimized implementation of vLLM 0.25.1's paged KV-cache manager (not written yet).

This package is intentionally empty: the optimized implementation is planned
but has not been written. When it exists it must behave exactly like the
executable specification in :mod:`kvspec`, as checked by the conformance kit
(:mod:`kvref`), and it may import only the value types of ``kvspec`` (errors,
config, request, hashing, events, view and stats), never its algorithms.
"""
