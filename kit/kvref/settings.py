"""Hypothesis settings profiles: ``dev``, ``ci``, ``nightly``, ``crosshair``.

``HYPOTHESIS_PROFILE`` selects one (default ``dev``). A *run* is one drawn
configuration driven through up to ``stateful_step_count`` rules; every
facade call in a run is one lockstep step.
"""

from __future__ import annotations

import importlib
import os

from hypothesis import HealthCheck, Phase, settings

from kvref.hypothesis_compat import pin_drawn_constants

PROFILES = {
    "dev": {"max_examples": 40, "stateful_step_count": 40},
    "ci": {"max_examples": 400, "stateful_step_count": 60},
    "nightly": {"max_examples": 5000, "stateful_step_count": 100},
    "crosshair": {"max_examples": 50, "stateful_step_count": 20},  # paths per test (ci/proofs.sh)
}


def register_profiles() -> None:
    """Register every profile with Hypothesis (idempotent)."""
    for name, values in PROFILES.items():
        backend = "crosshair" if name == "crosshair" and _crosshair_backend() else "hypothesis"
        settings.register_profile(
            f"kvref-{name}",
            deadline=None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
            max_examples=values["max_examples"],
            stateful_step_count=values["stateful_step_count"],
            backend=backend,
            phases=[p for p in Phase if p is not Phase.explain],
            database=None,
        )


def profile_settings(name: str | None = None) -> settings:
    """The settings of profile ``name`` (default: ``HYPOTHESIS_PROFILE`` or
    ``dev``) as a value, for one test, without loading it globally."""
    register_profiles()
    pin_drawn_constants()
    chosen = name or os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if chosen not in PROFILES:
        raise ValueError(f"unknown profile {chosen!r}; choose one of {', '.join(PROFILES)}")
    return settings.get_profile(f"kvref-{chosen}")


def load_profile(name: str | None = None) -> str:
    """Load ``name`` (default: ``HYPOTHESIS_PROFILE`` or ``dev``); return it.

    Also pins what Hypothesis draws from (:func:`kvref.hypothesis_compat.pin_drawn_constants`),
    so that a seeded run gives the same steps from any install.
    """
    register_profiles()
    pin_drawn_constants()
    chosen = name or os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if chosen not in PROFILES:
        raise ValueError(f"unknown profile {chosen!r}; choose one of {', '.join(PROFILES)}")
    settings.load_profile(f"kvref-{chosen}")
    return chosen


def _crosshair_backend() -> bool:
    """Whether the optional hypothesis-crosshair provider (``[dev]`` extra) imports."""
    try:
        importlib.import_module("hypothesis_crosshair_provider")
    except ImportError:
        return False
    return True
