"""kvref's settings profiles are the same in a CI job as on a desk.

Hypothesis loads its own ``ci`` profile (``derandomize=True``) by itself when a
CI variable such as ``CI`` or ``GITHUB_ACTIONS`` is set. A kvref profile must not
inherit from it: seeded runs would draw differently in CI, and HypoFuzz refuses a
derandomized test, so ``kvref fuzz`` ran nothing in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvref.settings import PROFILES

PROBE = """
import json
from hypothesis import settings
from kvref.settings import PROFILES, profile_settings
print(json.dumps({
    "hypothesis_default_derandomize": settings.default.derandomize,
    "kvref": {name: [profile_settings(name).derandomize, profile_settings(name).database is None]
              for name in PROFILES},
}))
"""


@pytest.mark.parametrize("variable", ["CI", "GITHUB_ACTIONS"])
def test_kvref_profiles_do_not_inherit_hypothesis_ci_profile(variable: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
    env[variable] = "true"
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    # the premise: Hypothesis did load its ci profile in this process
    assert found["hypothesis_default_derandomize"] is True, found
    assert found["kvref"] == {name: [False, True] for name in PROFILES}, found
