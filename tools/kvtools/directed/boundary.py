"""Directed scenarios for capacity at the free-block boundary.

One workload (:func:`_boundary_workload`) on pools of 2 to 14 blocks for
each of :data:`BOUNDARY_SHAPES`: somewhere in the sweep, every admission and
step of it meets the free-block boundary, where only an exact capacity
estimate gives the right answer (written for kvimpl's Mamba estimate
mutants).
"""

from __future__ import annotations

from kvspec.config import AttentionKind, FullAttention, Mamba, SlidingWindow
from kvtools.directed.script import Scenario, Script, config

BOUNDARY_SHAPES: dict[str, tuple[AttentionKind, ...]] = {
    "mamba-align": (Mamba(4, "align", 0),),
    "mamba-align-spec": (Mamba(4, "align", 1),),
    "mamba-all": (Mamba(4, "all", 0),),
    "mamba-all-spec": (Mamba(4, "all", 1),),
    "full+mamba-align": (FullAttention(4), Mamba(4, "align", 0)),
    "full@2x+mamba-align": (FullAttention(8), Mamba(8, "align", 0), SlidingWindow(4, 5)),
    "full+swa": (FullAttention(4), SlidingWindow(4, 5)),
    "swa-eagle": (SlidingWindow(4, 6),),
}

KNOWN_DIVERGENCES: dict[str, tuple[str, int]] = {
    name: ("mamba-align-external-estimate", 21)
    for name in ("boundary-full+mamba-align-n14", "boundary-mamba-align-n04", "boundary-mamba-align-spec-n07")
}
"""Scenarios where vLLM 0.25.1 differs from kvspec by a divergence of
``kit/kvref/divergences.toml``: (divergence id, step at which vLLM differs).
There, vLLM's Mamba align estimate for a request with connector tokens is a
block short and its pool raises; ``kvref replay --target vllm`` checks that
it fails exactly there (``ci/test.sh``)."""


def scenarios() -> list[Scenario]:
    """The workload on every shape and pool size."""
    out = []
    for shape, groups in BOUNDARY_SHAPES.items():
        eagle = shape == "swa-eagle" or shape.endswith("-spec")
        for blocks in range(2, 15):
            name = f"boundary-{shape}-n{blocks:02d}"
            out.append(
                Scenario(
                    name,
                    f"capacity estimates of {shape} on a pool of {blocks} blocks: the same workload on pools of 2 to "
                    "14 blocks puts every admission and step at the free-block boundary once (Mamba estimate mutants)",
                    config(*groups, num_blocks=blocks, use_eagle=eagle, max_model_len=48),
                    _boundary_workload,
                    KNOWN_DIVERGENCES.get(name),
                )
            )
    return out


def _boundary_workload(s: Script) -> None:
    """Admissions, decode, a shared prefix with connector tokens, a re-hit
    after free, a same-step hit and a preempted request re-admitted: on a
    pool just large enough, each capacity estimate decides an outcome."""
    sched = s.config.scheduler_block_size
    s.new_step()
    s.add("a", range(3 * sched + 1))
    s.admit("a", lookahead=1 if s.config.use_eagle else 0)
    s.add("b", [*range(2 * sched), 90, 91])
    s.admit("b")  # same step: a hit on blocks cached this step
    s.new_step()
    s.decode("a", 3, first_token=50)
    s.add("c", [*range(2 * sched), 70, 71, 72])
    s.admit("c", external=2)
    s.new_step()
    if s.computed("b"):
        s.preempt("b")
        s.admit("b")
        s.decode("b", 2, first_token=60)
    s.free("a")
    s.add("d", [*range(3 * sched + 1), 50])
    s.admit("d", full_sequence_must_fit=True)
    s.new_step()
    s.add("e", range(200, 200 + sched + 2))
    s.admit("e", reserved_blocks=1)
