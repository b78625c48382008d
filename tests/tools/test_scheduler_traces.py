"""The recorder of vLLM's real scheduler (``python -m kvtools scheduler-traces``).

With vLLM installed: a small run of the installed release's own scheduler
is recorded, replays step for step on kvref's vLLM adapter (the recording is
faithful), on kvspec and on kvimpl (both builds); a changed output or a
missing request operation makes that check fail; a call the format cannot
express is refused. Without vLLM only the committed corpus's layout is
checked here (``ci/test.sh`` replays it on every target).
"""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import load_factory
from kvref.adapters.vllm import installed_vllm_version, vllm_available
from kvref.ops import REQUEST_OPS
from kvref.shapes import build_kinds, shape_named
from kvref.traces import Trace, replay
from kvspec.config import KVCacheConfig
from kvspec.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ("0.25.1", "0.29.0", "0.33.0")


@pytest.fixture(scope="module")
def scheduler_ready() -> None:
    """Skip unless an installed vLLM's scheduler imports (checked on first use,
    so collecting this module does not import vLLM)."""
    if not vllm_available():
        pytest.skip("no supported vLLM is installed (bash ci/setup.sh --with-vllm)")
    try:
        importlib.import_module("vllm.v1.core.sched.scheduler")
    except Exception as exc:  # any import failure means the recorder cannot run here
        pytest.skip(f"vLLM's scheduler does not import here: {exc!r}")


@pytest.fixture(scope="module")
def recording(scheduler_ready: None) -> Any:
    """One small synchronous run on a Mamba hybrid (faithful on every release driven)."""
    from kvtools.scheduler_engine import Scenario  # noqa: PLC0415 - imports vLLM's scheduler
    from kvtools.scheduler_traces import record  # noqa: PLC0415

    scenario = Scenario("t-mamba", "full+mamba-align", False, 11, num_blocks=16, calls=90, log_stats=True)
    return record(scenario)


def test_the_recording_replays_on_real_vllm(recording: Any) -> None:
    from kvtools.scheduler_traces import check_faithful  # noqa: PLC0415

    trace: Trace = recording.trace
    result = check_faithful(trace)
    assert result.ok, (result.failed_step, result.message)
    calls = [s for s in trace.steps if s["op"] not in REQUEST_OPS]
    assert len(calls) >= 90
    ops = {s["op"] for s in calls}
    assert {"new_step_starts", "get_computed_blocks", "allocate_slots", "free"} <= ops, ops
    assert trace.config.profile.name == f"vllm-{installed_vllm_version()}"
    assert trace.meta["scheduler"]["class"] == "Scheduler"
    assert trace.meta["scheduler"]["requests"] == recording.requests > 3
    # The run drains: every request finished, the last view holds no table.
    last = recording.recorder.views[max(recording.recorder.views)]
    assert last.tables == ()


@pytest.mark.parametrize("build", ["spec", "impl", "impl-python"])
def test_the_recording_replays_on_kvspec_and_kvimpl(recording: Any, build: str) -> None:
    result = replay(recording.trace, load_factory(build), "<recording>")
    assert result.ok, (build, result.failed_step, result.message, result.skipped)


def test_a_changed_output_is_not_faithful(recording: Any) -> None:
    from kvtools.scheduler_traces import check_faithful  # noqa: PLC0415

    trace = copy.deepcopy(recording.trace)
    index = next(
        i for i, s in enumerate(trace.steps) if s["op"] == "allocate_slots" and s.get("expect") and s["expect"][0]
    )
    trace.steps[index]["expect"][0][0] += 1
    result = check_faithful(trace)
    assert not result.ok and result.failed_step == index


def test_a_dropped_request_state_is_not_faithful(recording: Any) -> None:
    """Without a ``set_request`` the replayed request is behind the live one."""
    from kvtools.scheduler_traces import check_faithful  # noqa: PLC0415

    trace = copy.deepcopy(recording.trace)
    index = next(
        i for i, s in enumerate(trace.steps) if s["op"] == "set_request" and s.get("num_computed_tokens", 0) > 0
    )
    del trace.steps[index]
    assert not check_faithful(trace).ok


def test_a_call_the_format_cannot_express_is_refused(scheduler_ready: None) -> None:
    from kvtools.scheduler_recorder import Recorder, RecordingManager, Unrecordable  # noqa: PLC0415
    from kvtools.scheduler_rig import RigSettings, build_scheduler  # noqa: PLC0415

    profile = PROFILES[f"vllm-{installed_vllm_version()}"]
    config = KVCacheConfig(num_blocks=8, groups=build_kinds(shape_named("full"), 4), max_model_len=32, profile=profile)
    rig = build_scheduler(config, RigSettings())
    proxy = RecordingManager(rig.manager, Recorder(rig.api, rig.manager))
    with pytest.raises(Unrecordable, match="create_kv_cache_blocks"):
        _ = proxy.create_kv_cache_blocks
    request = rig.vllm["request"].Request(
        request_id="x",
        prompt_token_ids=[1, 2, 3],
        sampling_params=rig.vllm["sampling"].SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=rig.hasher,
        **rig.api.request_args,
    )
    with pytest.raises(Unrecordable, match="get_computed_blocks"):
        proxy.get_computed_blocks(request, 2)  # a hit limit: an argument of 0.26.0 on, none before


def _corpus(release: str) -> list[Path]:
    return sorted((ROOT / "traces" / f"vllm-{release}" / "scheduler").glob("*.jsonl"))


@pytest.mark.parametrize("release", RELEASES)
def test_the_corpus_covers_each_release(release: str) -> None:
    """Each release's folder holds full attention, a sliding-window hybrid and
    a Mamba hybrid under the synchronous scheduler, and at least one trace of
    the asynchronous one; every header names the release and the scheduler."""
    files = _corpus(release)
    headers = [json.loads(p.read_text().split("\n", 1)[0]) for p in files]
    for path, header in zip(files, headers, strict=True):
        assert header["semantics"] == f"vllm-{release}", path
        assert header["scheduler"]["release"] == release, path
        assert header["scheduler"]["scenario"] == path.stem, path
    sync_shapes = {h["shape"] for h in headers if h["scheduler"]["class"] == "Scheduler"}
    assert {"full", "full+swa", "full+mamba-align"} <= sync_shapes, sync_shapes
    assert any(h["scheduler"]["class"] == "AsyncScheduler" for h in headers)
