"""kvref adapters for aphrodite-engine 0.24.1 (a vLLM fork, package ``aphrodite``).

Its core is a vLLM main snapshot after 0.29.0: it is driven like vLLM 0.29.0
and claims that release's semantics.
"""

from kvref import VllmLineage

APHRODITE = VllmLineage(package="aphrodite", env_prefix="APHRODITE_", upstream="0.29.0")
make = APHRODITE.make
make_pool = APHRODITE.make_pool

UPSTREAM = VllmLineage(upstream="0.29.0")
"""vLLM 0.29.0 itself, the release aphrodite derives from."""
upstream = UPSTREAM.make
