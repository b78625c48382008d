"""``kvref drift``'s surface comparison, and a release newer than every profile.

The surface of a release (:mod:`kvref.surface`) is read from its sources;
each profile's is recorded in ``kvref/surfaces/``. Between the recorded
surfaces of 0.33.0 and 0.34.0 lie the scheduler-visible changes of 0.34.0,
each explained by the switch that models it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from kvref.adapters.vllm import installed_vllm_version
from kvref.cli import main
from kvref.drift import SURFACE_SWITCHES, explain_surface, features_of_trace, surface_for_class
from kvref.surface import SURFACES, SurfaceChange, compare, declared_surface, read_surface
from kvspec.profiles import PROFILES, VLLM_0_33_0, VLLM_0_34_0, release_key

ROOT = Path(__file__).resolve().parents[2]
NEWEST_VENV = ROOT / ".venv-vllm-newest"


def test_every_profile_has_its_recorded_surface() -> None:
    recorded = {p.stem.removeprefix("vllm-") for p in SURFACES.glob("vllm-*.json")}
    assert {p.release for p in PROFILES.values()} <= recorded
    for switches in SURFACE_SWITCHES.values():
        assert all(hasattr(VLLM_0_34_0, s) for s in switches), switches


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_recorded_surface_is_what_the_reader_reads_from_the_release() -> None:
    release = installed_vllm_version()
    assert release is not None
    recorded = declared_surface(release)
    if recorded is None:
        pytest.skip(f"no surface recorded for vLLM {release}")
    assert read_surface() == recorded


def test_the_six_scheduler_visible_changes_of_0_34_0() -> None:
    before, after = declared_surface("0.33.0"), declared_surface("0.34.0")
    assert before is not None and after is not None
    changes: dict[tuple[str, str], SurfaceChange] = {(c.kind, c.entry): c for c in compare(before, after)}
    explained = {key: explain_surface(c, VLLM_0_33_0, VLLM_0_34_0) for key, c in changes.items()}
    want = {
        ("removed", "KVCacheManager.get_num_common_prefix_blocks"): "common_prefix (0.34.0)",
        ("new", "KVCacheManager.get_num_cached_tokens"): "num_cached_tokens_op (0.34.0)",
        ("removed", "Request.skip_reading_prefix_cache"): "hit_limit_at_construction (0.34.0)",
        ("removed", "Request.get_skip_reading_prefix_cache"): "hit_limit_at_construction (0.34.0)",
        ("new", "Request.prefix_cache_hit_limit"): "hit_limit_at_construction (0.34.0)",
        ("new", "Request.get_prefix_cache_hit_limit"): "prompt_logprobs_hit_cap (0.34.0)",
        ("new", "Request.get_max_cache_hit_length"): "hit_length_bound (0.34.0)",
        ("changed", "Request.prompt_token_ids"): "token_ids_int32 (0.34.0)",
    }
    assert {k: explained[k] for k in want} == want
    assert "TokenBuffer" in str(changes["changed", "Request.prompt_token_ids"].after)
    # every other change is listed as not modelled, never credited to a switch
    assert {v for k, v in explained.items() if k not in want} == {"not modelled"}


def test_without_a_reference_profile_a_change_names_the_switches_of_its_entry() -> None:
    change = SurfaceChange("removed", "KVCacheManager.get_num_common_prefix_blocks", "(running_request_id: str)", None)
    assert explain_surface(change, VLLM_0_34_0, None) == "not modelled (switches of this entry: common_prefix)"
    assert surface_for_class("get_num_common_prefix_blocks/absent", [change]) == change
    assert surface_for_class("allocate_slots/output", [change]) is None


def test_the_reader_on_a_release_it_never_saw(tmp_path: Path) -> None:
    """An operation, parameter or field kvref does not know is listed, never a crash."""
    core = tmp_path / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    (core / "kv_cache_manager.py").write_text(
        textwrap.dedent(
            """
            class KVCacheManager:
                def __init__(self, kv_cache_config, max_model_len: int, *, brand_new: "int | None" = None): ...
                @property
                def usage(self) -> float: ...
                def peek_everything(self, request, depth: int = 3) -> int: ...
                def _private(self): ...
            """
        )
    )
    (tmp_path / "vllm" / "v1" / "request.py").write_text(
        textwrap.dedent(
            """
            class Request:
                def __init__(self, request_id: str, prompt_token_ids):
                    self.request_id = request_id
                    self.tokens: list[int] = Buffer(prompt_token_ids) if prompt_token_ids else None
                    self._hidden = 1
            class RequestStatus:
                WAITING = 1
            """
        )
    )
    (tmp_path / "vllm" / "v1" / "kv_cache_interface.py").write_text(
        textwrap.dedent(
            """
            class KVCacheSpec:
                block_size: int
            class RingSpec(KVCacheSpec):
                slots: int = 2
            class Unrelated:
                x: int = 0
            """
        )
    )
    surface = read_surface(tmp_path)
    assert surface == {
        "KVCacheManager.__init__": "(kv_cache_config, max_model_len: int, *, brand_new: int | None = None)",
        "KVCacheManager.peek_everything": "(request, depth: int = 3)",
        "KVCacheManager.usage": "property",
        "KVCacheSpec": "class()",
        "KVCacheSpec.block_size": "field: int",
        "Request.__init__": "(request_id: str, prompt_token_ids)",
        "Request.request_id": "attribute",
        "Request.tokens": "attribute: list[int] = Buffer(...)",
        "RequestStatus.WAITING": "member",
        "RingSpec": "class(KVCacheSpec)",
        "RingSpec.slots": "field: int = 2",
    }
    declared = {**surface, "KVCacheManager.__init__": "(kv_cache_config, max_model_len: int)"}
    del declared["KVCacheManager.peek_everything"]
    changes = compare(declared, surface)
    assert [c.describe() for c in changes] == [
        "changed KVCacheManager.__init__: new parameter brand_new: int | None = None",
        "new KVCacheManager.peek_everything (request, depth: int = 3)",
    ]
    assert explain_surface(changes[1], VLLM_0_33_0, VLLM_0_34_0) == "not modelled"


def test_drift_on_the_pool_layer_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``kvref drift --layer pool`` (it once failed on every release before its first step)."""
    code = main(["drift", "--layer", "pool", "--against", "spec", "--min-steps", "100", "--semantics", "vllm-0.33.0"])
    assert code == 0, capsys.readouterr().err
    assert "0 distinct divergence class(es)" in capsys.readouterr().out


def _newest_venv_release() -> str | None:
    python = NEWEST_VENV / "bin" / "python"
    if not python.exists():
        return None
    out = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('vllm'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else None


NEWEST_RELEASE = _newest_venv_release()

PRETEND = """
from importlib.metadata import version

import kvspec.profiles as profiles

# the profile list as it was before 0.34.0's
del profiles.PROFILES["vllm-0.34.0"]
profiles.NEWEST = profiles.VLLM_0_33_0

from kvref.cli import main  # noqa: E402  # after the cut, so the CLI sees it

assert main(["install-vllm", version("vllm")]) == 0
# 3,000 steps: the first batch's runs that call get_num_common_prefix_blocks (gone in 0.34.0) stop at
# that skip until the operation is left out; at 300 steps they were most runs, below the verdict's floor.
# The check runs to a verdict: it may find what the release changed (an operation 0.34.0 added answers
# where the 0.33.0 profile expects a refusal), which is what drift then lists
code = main(["check", "--target", "spec", "--against", "vllm", "--min-steps", "3000", "--seed", "1"])
assert code in (0, 1), code
code = main(["drift", "--surface-only"])
assert code == 1, code
print("pretend: ok")
"""


@pytest.mark.skipif(
    NEWEST_RELEASE is None or release_key(NEWEST_RELEASE) < (0, 34, 0),
    reason="needs vLLM 0.34.0 or newer in .venv-vllm-newest (bash ci/setup.sh --with-vllm-newest)",
)
def test_a_release_newer_than_every_profile_installs_checks_and_drifts(tmp_path: Path) -> None:
    """With the profile list cut at 0.33.0, real vLLM 0.34.0 (or newer) is
    installed, checked under the newest remaining profile with a one-line
    notice, and drift lists its surface changes."""
    env = {**os.environ, "KVREF_FAILURE_DIR": str(tmp_path), "COLUMNS": "200"}
    run = subprocess.run(
        [str(NEWEST_VENV / "bin" / "python"), "-c", PRETEND],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path, timeout=1800,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "pretend: ok" in out
    assert "already importable" in out
    assert "is newer than kvref's newest semantics profile (vllm-0.33.0): checking it under vllm-0.33.0" in out
    assert "KVCacheManager.get_num_cached_tokens" in out
    assert "KVCacheManager.get_num_common_prefix_blocks" in out


def test_a_class_without_switch_or_surface_entry_names_its_features(tmp_path: Path) -> None:
    tail = ROOT / "traces" / "vllm-0.34.0" / "golden" / "full@2x+swa-0003.jsonl"
    assert features_of_trace(tail) == ["partial-tail-entries"]
    assert features_of_trace(ROOT / "traces" / "vllm-0.34.0" / "golden" / "full-0001.jsonl") == []
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not a trace\n")
    assert features_of_trace(broken) == []
