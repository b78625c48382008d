"""``kvref replay``: replay stored traces against an adapter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.traces import load, replay


def add_parser(sub: Any) -> None:
    """Register ``replay`` on the subcommand parser ``sub``."""
    rep = sub.add_parser("replay", help="replay trace files against an adapter")
    rep.add_argument("files", nargs="+", type=Path)
    rep.add_argument("--target", default="spec")
    rep.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay traces; a trace marked ``known_divergence`` must fail on vLLM
    at its marked step and pass elsewhere. ``divergence_step == -1`` marks a
    divergence at construction: on vLLM every step must pass and the adapter
    must report that it was built through the documented workaround
    (``construction_workaround`` equal to the divergence id)."""
    files: list[Path] = args.files
    target: str = args.target
    factory = load_factory(target)
    bad = 0
    for path in files:
        trace = load(path)
        built: list[KVCacheAdapter] = []
        result = replay(trace, _remembering(factory, built), str(path))
        known = trace.meta.get("known_divergence")
        if known and target == "vllm" and trace.meta.get("divergence_step") == -1:
            workaround = getattr(built[0], "construction_workaround", None) if built else None
            ok = result.ok and workaround == known
            status = f"known divergence {known} confirmed at construction"
            if not ok:
                status = f"known divergence {known} NOT reproduced ({workaround=}, {result.message or 'steps ok'})"
        elif known and target == "vllm":
            ok = not result.ok and result.failed_step == trace.meta.get("divergence_step")
            status = f"known divergence {known} confirmed" if ok else f"known divergence {known} NOT reproduced"
        else:
            ok = result.ok
            status = "ok" if ok else f"FAILED at step {result.failed_step}: {result.message}"
        bad += not ok
        print(f"{path}: {status} ({result.steps} steps)")
    print(f"{len(files) - bad}/{len(files)} traces as expected against {target}")
    return 1 if bad else 0


def _remembering(factory: AdapterFactory, built: list[KVCacheAdapter]) -> AdapterFactory:
    """``factory``, also appending every adapter it builds to ``built``."""

    def build(config: Any) -> KVCacheAdapter:
        adapter = factory(config)
        built.append(adapter)
        return adapter

    return build
