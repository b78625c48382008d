"""Template: a vLLM fork (renamed package) or a plugin subclassing vLLM's manager.

Edit the lineage and run::

    kvref check --target my_fork_adapter:make --against spec --keep-going   # every difference from its profile
    kvref check --target my_fork_adapter:make --against vllm --keep-going   # against its upstream release
    kvref check --layer pool --target my_fork_adapter:make_pool --against spec

For a plugin, keep ``package="vllm"`` and set
``manager_class="myplugin.kv:MyKVCacheManager"``. Differences the fork is
known to have go into ``known`` (registry ids or :class:`kvref.Divergence`
values) or a file passed with ``--known``. ``features={"context-parallelism"}``
opts in to configurations with ``dcp_world_size`` or ``pcp_world_size``
above 1; ``unsupported`` and ``supports`` declare what the fork lacks, as
``kvref.declare`` does; an ``era_class`` for an internal the fork changed
subclasses ``FORK.base_era()`` (``kvref.ERA_NAMES`` lists the eras).
"""

from __future__ import annotations

from kvref import VllmLineage

FORK = VllmLineage(package="vllm", env_prefix="VLLM_", upstream="0.25.1")
make = FORK.make
make_pool = FORK.make_pool
