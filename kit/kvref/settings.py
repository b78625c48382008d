"""Hypothesis settings profiles: ``dev``, ``ci``, ``nightly``, ``crosshair``.

``kvref check --profile`` or the pytest plugin's ``--kvref-profile`` selects
one, else the variable :data:`ENV` (``KVREF_PROFILE``), else ``dev``. A *run*
is one drawn configuration driven through up to ``stateful_step_count``
rules; every facade call in a run is one lockstep step.

NOTE: what ships reads only a variable of its own. It read Hypothesis's
generic ``HYPOTHESIS_PROFILE`` once, and a user whose own profile had that
name lost their whole pytest session to the plugin's refusal of it. This
repository's tests choose kvref's profile with ``HYPOTHESIS_PROFILE``
(tests/conftest.py passes it here by name).
"""

from __future__ import annotations

import importlib
import os

from hypothesis import HealthCheck, Phase, settings

from kvref.hypothesis_compat import pin_drawn_constants

ENV = "KVREF_PROFILE"
"""The variable that names kvref's settings profile when no option does."""
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
            # Hypothesis's own "default", not whatever profile is loaded: Hypothesis
            # loads its "ci" profile by itself where a CI variable is set (CI,
            # GITHUB_ACTIONS, ...), and a kvref profile that inherited its
            # derandomize=True would run other inputs in CI than on a desk, and
            # HypoFuzz would refuse its test (kvref fuzz ran nothing under CI=true).
            settings.get_profile("default"),
            derandomize=False,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
            max_examples=values["max_examples"],
            stateful_step_count=values["stateful_step_count"],
            backend=backend,
            phases=[p for p in Phase if p is not Phase.explain],
            database=None,
        )


def chosen(name: str | None = None) -> str:
    """``name``, else :data:`ENV`, else ``dev``.

    Raises:
        ValueError: For a name that is not one of :data:`PROFILES`.
    """
    found = name or os.environ.get(ENV) or "dev"
    if found not in PROFILES:
        where = "" if name else f" ({ENV})"
        raise ValueError(f"unknown kvref settings profile {found!r}{where}; choose one of {', '.join(PROFILES)}")
    return found


def profile_settings(name: str | None = None) -> settings:
    """The settings of profile ``name`` (:func:`chosen`) as a value, for one
    run, without loading it globally or changing anything else in Hypothesis
    (pin the drawn constants around the run: :func:`kvref.hypothesis_compat.pinned_constants`)."""
    register_profiles()
    return settings.get_profile(f"kvref-{chosen(name)}")


def load_profile(name: str | None = None) -> str:
    """Load profile ``name`` (:func:`chosen`) as Hypothesis's default for the
    whole process (the ``kvref`` command, this repository's tests); return it.

    Also pins what Hypothesis draws from (:func:`kvref.hypothesis_compat.pin_drawn_constants`),
    so that a seeded run gives the same steps from any install.
    """
    register_profiles()
    pin_drawn_constants()
    name = chosen(name)
    settings.load_profile(f"kvref-{name}")
    return name


def _crosshair_backend() -> bool:
    """Whether the optional hypothesis-crosshair provider (``[dev]`` extra) imports."""
    try:
        importlib.import_module("hypothesis_crosshair_provider")
    except ImportError:
        return False
    return True
