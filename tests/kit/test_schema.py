"""Every stored trace matches the JSON Schema of the trace format
(``traces/schema/trace.schema.json``), and the schema rejects malformed lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "traces" / "schema" / "trace.schema.json").read_text())
HEADER = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/header"})
STEP = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/step"})
END = Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": "#/$defs/end"})
CORPUS = sorted((ROOT / "traces").glob("vllm-*/*/*.jsonl"))
FOLDERS = sorted({p.parent.relative_to(ROOT / "traces").as_posix() for p in CORPUS})


def test_schema_is_valid() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert len(CORPUS) >= 300


@pytest.mark.parametrize("folder", FOLDERS)
def test_corpus_matches_schema(folder: str) -> None:
    problems = []
    for path in (p for p in CORPUS if p.parent.relative_to(ROOT / "traces").as_posix() == folder):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        problems += [f"{path.name}:1: {e.message}" for e in HEADER.iter_errors(lines[0])]
        steps = lines[1:]
        if lines[0].get("version") == 2:
            problems += [f"{path.name}:{len(lines)}: {e.message}" for e in END.iter_errors(lines[-1])]
            steps = lines[1:-1]
        for i, step in enumerate(steps, start=2):
            problems += [f"{path.name}:{i}: {e.message}" for e in STEP.iter_errors(step)]
    assert not problems, problems[:10]


@pytest.mark.parametrize(
    "step",
    [
        {"op": "allocate_slots", "rid": "r1"},
        {"op": "add_request", "rid": "r1", "prompt": []},
        {"op": "get_block_ids"},
        {"op": "no_such_operation", "rid": "r1"},
        {"op": "free_blocks", "block_ids": [1], "view": "not-a-digest"},
        {"op": "set_request", "rid": "r1", "status": "DONE"},
    ],
)
def test_schema_rejects_malformed_steps(step: dict[str, Any]) -> None:
    assert not STEP.is_valid(step)


def test_schema_rejects_a_foreign_header() -> None:
    header = json.loads((CORPUS[0]).read_text().splitlines()[0])
    assert HEADER.is_valid(header)
    assert not HEADER.is_valid({**header, "version": 3})
    assert not END.is_valid({"end": {"steps": 1}})
    assert not HEADER.is_valid({**header, "config": {**header["config"], "groups": []}})


POOL_STEPS = [
    {"op": "get_new_blocks", "num_blocks": 2, "expect": [1, 2], "view": "0" * 64},
    {"op": "cache_full_blocks", "rid": "a", "block_ids": [1, 2], "num_cached_blocks": 0, "num_full_blocks": 2,
     "block_size": 2, "group_id": 0, "view": "0" * 64},
    {"op": "get_cached_block", "block_hash": "ab01", "group_ids": [0], "expect": [1]},
    {"op": "touch", "block_ids": [1]},
    {"op": "free_blocks", "block_ids": [2, 1]},
    {"op": "get_num_free_blocks", "expect": 15},
    {"op": "get_usage", "expect": 0.0},
]  # fmt: skip


@pytest.mark.parametrize("step", POOL_STEPS, ids=lambda s: str(s["op"]))
def test_schema_accepts_pool_steps(step: dict[str, Any]) -> None:
    assert STEP.is_valid(step), [e.message for e in STEP.iter_errors(step)]


@pytest.mark.parametrize(
    "step",
    [{"op": "get_new_blocks", "num_blocks": -1}, {"op": "get_cached_block", "block_hash": "xyz"},
     {"op": "touch", "block_ids": [1], "num_tokens": 3}],
)  # fmt: skip
def test_schema_rejects_malformed_pool_steps(step: dict[str, Any]) -> None:
    assert not STEP.is_valid(step)


def test_header_features_and_layer() -> None:
    header = json.loads((CORPUS[0]).read_text().splitlines()[0])
    assert HEADER.is_valid({**header, "features": ["caching", "kind:FullAttention"], "layer": "pool"})
    assert not HEADER.is_valid({**header, "features": "caching"})
    assert not HEADER.is_valid({**header, "layer": "scheduler"})
