"""Copy-and-edit adapter templates (docs/writing-an-adapter.md).

Each template runs as it is, around a stand-in engine from kvspec, so that a
copy passes ``kvref check`` before the first edit; replace the stand-in with
your engine one method at a time. They import only kvref's public names
(:data:`kvref.__all__`) and kvspec's value types.

* :mod:`.adapter_template`: the facade (``kvref check --target mymod:make``);
* :mod:`.pool_adapter_template`: the block pool alone (``--layer pool``);
* :mod:`.fork_adapter_template`: a vLLM fork or plugin (:class:`kvref.VllmLineage`).
"""
