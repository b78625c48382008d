"""``kvref drift``'s attribution: which profile switches explain a trace.

The traces recorded in lockstep with real vLLM 0.33.0 hold that release's
outputs and views, so they stand in for a drift class's shrunk trace: under
the 0.25.1 profile kvspec cannot replay them, and the attribution must name
exactly the switches that make it replay them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from kvref.adapters import load_factory
from kvref.cli import build_parser
from kvref.drift import SWITCHES, attribute, differing_switches, introduced_in, with_switches
from kvref.traces import Trace, TraceFormatError, load
from kvspec.config import KVCacheConfig, Mamba
from kvspec.profiles import PROFILES, VLLM_0_25_1, VLLM_0_27_1, VLLM_0_28_0, VLLM_0_33_0

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_0_33 = ROOT / "traces" / "vllm-0.33.0" / "golden"
SPEC = load_factory("spec")


def test_sink_trace_is_explained_by_the_two_switches_it_needs() -> None:
    trace = load(GOLDEN_0_33 / "sink-0001.jsonl")
    found = attribute(trace, SPEC, VLLM_0_25_1, VLLM_0_33_0)
    assert found is not None
    assert found.switches == ("stats_at_lookup", "sink_blocks_reserved")
    assert found.releases == ("0.27.0", "0.30.0")
    # and the named switches really are what replays it: one of them alone does not
    assert attribute(trace, SPEC, with_switches(VLLM_0_25_1, ("stats_at_lookup",), VLLM_0_33_0), VLLM_0_33_0) == (
        replace(found, switches=("sink_blocks_reserved",), releases=("0.30.0",))
    )


def test_a_trace_the_working_profile_replays_is_not_attributed() -> None:
    trace = load(GOLDEN_0_33 / "sink-0001.jsonl")
    assert attribute(trace, SPEC, VLLM_0_33_0, VLLM_0_33_0) is None


def test_a_change_no_switch_models_is_not_credited_to_one() -> None:
    # A 0.33.0 trace whose last expected output is corrupted: no profile reproduces it.
    trace = load(GOLDEN_0_33 / "sink-0001.jsonl")
    steps = [dict(s) for s in trace.steps]
    last = next(i for i in reversed(range(len(steps))) if steps[i]["op"] == "get_computed_blocks")
    steps[last]["expect"] = {"blocks": [[999]], "num_computed_tokens": 12345}
    assert attribute(Trace(trace.config, steps, trace.meta), SPEC, VLLM_0_25_1, VLLM_0_33_0) is None


def test_introduced_in_skips_a_reverted_change() -> None:
    # 0.27.x queued freed blocks first-in-first-out without caching; 0.28.0 reverted it.
    assert VLLM_0_27_1.free_unhashed_needs_caching != VLLM_0_28_0.free_unhashed_needs_caching
    assert introduced_in("free_unhashed_needs_caching", VLLM_0_33_0) == "0.28.0"  # the revert
    assert introduced_in("common_prefix", VLLM_0_33_0) == "0.32.0"
    assert introduced_in("free_unhashed_needs_caching", VLLM_0_27_1) == "0.27.0"


def test_differing_switches_are_ordered_by_release() -> None:
    names = differing_switches(VLLM_0_25_1, VLLM_0_33_0)
    assert set(names) == {s for s in SWITCHES if getattr(VLLM_0_25_1, s) != getattr(VLLM_0_33_0, s)}
    order = [list(PROFILES).index(f"vllm-{introduced_in(s, VLLM_0_33_0)}") for s in names]
    assert order == sorted(order)


def test_a_trace_of_a_drifted_profile_names_its_switches(tmp_path: Path) -> None:
    trace = load(GOLDEN_0_33 / "sink-0001.jsonl")
    drifted = with_switches(VLLM_0_25_1, ("stats_at_lookup", "sink_blocks_reserved"), VLLM_0_33_0)
    path = Trace(replace(trace.config, profile=drifted), trace.steps, trace.meta).write(tmp_path / "t.jsonl")
    header = json.loads(path.read_text().splitlines()[0])
    assert header["semantics"] == "vllm-0.25.1"
    assert header["switches"] == {"stats_at_lookup": False, "sink_blocks_reserved": False}
    schema = json.loads((ROOT / "traces" / "schema" / "trace.schema.json").read_text())
    assert Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/header"}).is_valid(header)
    assert load(path).config.profile == drifted
    # a release profile writes no switches
    plain = Trace(trace.config, trace.steps, trace.meta).write(tmp_path / "p.jsonl")
    assert "switches" not in json.loads(plain.read_text().splitlines()[0])


@pytest.mark.parametrize("switches", [{"no_such_switch": True}, ["stats_at_lookup"]])
def test_a_bad_switches_header_is_an_input_error(tmp_path: Path, switches: object) -> None:
    trace = load(GOLDEN_0_33 / "sink-0001.jsonl")
    lines = Trace(trace.config, trace.steps, trace.meta).dumps().splitlines()
    header = json.loads(lines[0])
    header["switches"] = switches
    body = "\n".join([json.dumps(header), *lines[1:-1]]) + "\n"  # a version 2 file needs its end line
    end = {"end": {"steps": len(lines) - 2, "sha256": hashlib.sha256(body.encode()).hexdigest()}}
    path = tmp_path / "bad.jsonl"
    path.write_text(body + json.dumps(end) + "\n")
    with pytest.raises(TraceFormatError, match="switch"):
        load(path)


def test_a_configuration_the_release_refuses_is_explained_by_the_switch_that_refuses_it() -> None:
    # vLLM 0.33.0 refuses a cached Mamba group in mode 'all'; the lockstep's
    # trace of that crash has no steps, and the 0.33.0 switch refuses it too.
    config = KVCacheConfig(
        num_blocks=16, groups=(Mamba(2, mode="all"),), max_model_len=32, enable_caching=True, profile=VLLM_0_25_1
    )
    message = "constructing make_vllm_adapter crashed: ConfigError: group 0: vLLM 0.33.0 caches Mamba only in 'align'"
    found = attribute(Trace(config, [], {"failure": message}), SPEC, VLLM_0_25_1, VLLM_0_33_0)
    assert found is not None and found.switches == ("mamba_caching_needs_align",)
    # a crash that is not a refusal is not credited to a switch
    crash = Trace(config, [], {"failure": "constructing make_vllm_adapter crashed: RuntimeError: boom"})
    assert attribute(crash, SPEC, VLLM_0_25_1, VLLM_0_33_0) is None


def test_drift_runs_the_ci_step_goal_by_default() -> None:
    """``kvref drift`` runs the ci profile unless told otherwise: a dev-sized run
    (2,000 steps) stops after the first class or two; ``kvref check`` keeps dev."""
    parser = build_parser()
    assert parser.parse_args(["drift"]).profile == "ci"
    assert parser.parse_args(["drift", "--profile", "nightly"]).profile == "nightly"
    assert parser.parse_args(["check"]).profile == "dev"
