"""The memcheck tier of the C mutation hunt (kvtools.cmutants.memcheck) and the native core under
AddressSanitizer and UBSan.

Plumbing: a sanitizer report kills (its first line is the reason), a clean run passes, the hunt
refuses to start without the sanitizer runtime, and a survivor of the other tiers gets only the
new tier. Then the core itself, built with the sanitizers in a temporary folder (the checkout's
extension is never touched): the unmutated core runs the fast tier's tests with no report (the CI
check that the core writes nothing out of bounds), and the one known gap of the hunt, a write one
entry past the host-tables array (``hosttab.c:122:27:lt_to_le``), planted, is caught. Both skip,
saying why, where the compiler has no AddressSanitizer runtime; the planted one also without torch
(its test drives the device tables).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from kvtools.cmutants import memcheck
from kvtools.cmutants.build import SOURCES, Stage
from kvtools.cmutants.generate import Mutant, mutants
from kvtools.cmutants.reach import TierReach
from kvtools.cmutants.runner import (
    FAST,
    FAST_TESTS,
    MEMCHECK,
    Hunter,
    build_parser,
    hunt_all,
    judge,
    missing_tiers,
    tiers_setting,
)


def _runtime_or_none() -> str | None:
    try:
        memcheck.runtime()
    except memcheck.RuntimeMissing as exc:
        return str(exc)
    return None


NO_RUNTIME = _runtime_or_none()
NO_TORCH = importlib.util.find_spec("torch") is None
needs_sanitizers = pytest.mark.skipif(NO_RUNTIME is not None, reason=f"no AddressSanitizer runtime here: {NO_RUNTIME}")
needs_torch = pytest.mark.skipif(NO_TORCH, reason="torch is not installed (the device-table tests skip without it)")

ASAN_OUTPUT = """\
....................
=================================================================
==3618==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x61e00050e6a0 at pc 0x7f173e1400a8 bp 0x7ff
WRITE of size 4 at 0x61e00050e6a0 thread T0
    #0 0x7f173e1400a7 in host_row_sync kvref-cmutants-x/memcheck/mutant/hosttab.c:123
    #1 0x7f173e138594 in core_allocate /src/impl/kvimpl/_native/core.c:723
"""
UBSAN_OUTPUT = (
    "...........impl/kvimpl/_native/hit.c:181:17: runtime error: null pointer passed as argument 1, which is "
    "declared to never be null\n    #0 0x7f8a24581700 in hybrid_hit impl/kvimpl/_native/hit.c:181\n"
)


def test_first_report_names_the_fault_without_addresses() -> None:
    assert (
        memcheck.first_report(ASAN_OUTPUT)
        == "AddressSanitizer: heap-buffer-overflow: WRITE of size 4 in host_row_sync (hosttab.c:123)"
    )
    assert memcheck.first_report(UBSAN_OUTPUT) == (
        "UBSan: hit.c:181:17: null pointer passed as argument 1, which is declared to never be null"
    )
    assert memcheck.first_report("....\n1 failed: ERROR tests/x.py::test_y\n") is None


@pytest.mark.parametrize(
    ("code", "output", "verdict", "how"),
    [
        (0, "...... 714 passed", "survived", ""),
        (memcheck.EXIT, ASAN_OUTPUT, "killed", "memcheck: AddressSanitizer: heap-buffer-overflow: WRITE of size 4"),
        (memcheck.EXIT, UBSAN_OUTPUT, "killed", "memcheck: UBSan: hit.c:181:17: null pointer"),
        (memcheck.EXIT, "", "killed", "sanitizer exit 86 (no report found"),
        (
            1,
            "FAILED tests/impl/test_native.py::test_x - assert 1 == 2",
            "killed",
            "memcheck: tests/impl/test_native.py::test_x",
        ),
        (-signal.SIGSEGV, "", "killed", "memcheck: crash (SIGSEGV)"),
        (None, "", "timeout", "memcheck: still running"),
        (4, "usage", "error", "memcheck: pytest exit 4"),
    ],
)
def test_memcheck_verdicts(code: int | None, output: str, verdict: str, how: str) -> None:
    got_verdict, got_how = judge(MEMCHECK, code, output)
    assert got_verdict == verdict
    assert how in got_how


def test_the_environment_preloads_the_runtime_first() -> None:
    env = memcheck.environment([Path("/lib/libasan.so.8"), Path("/lib/libstdc++.so.6")], {"LD_PRELOAD": "mine.so"})
    assert env["LD_PRELOAD"] == "/lib/libasan.so.8 /lib/libstdc++.so.6 mine.so"
    assert "detect_leaks=0" in env["ASAN_OPTIONS"] and f"exitcode={memcheck.EXIT}" in env["ASAN_OPTIONS"]
    assert "halt_on_error=1" in env["UBSAN_OPTIONS"] and f"exitcode={memcheck.EXIT}" in env["UBSAN_OPTIONS"]
    assert env["PYTHONMALLOC"] == "malloc"


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(argparse.ArgumentParser()).parse_args(list(argv))


def test_a_survivor_of_the_other_tiers_gets_the_memcheck_tier_only() -> None:
    without = tiers_setting(_args("--no-memcheck", "--semantics", "vllm-0.33.0"))
    with_it = tiers_setting(_args("--semantics", "vllm-0.33.0"))
    assert with_it == {**without, "memcheck": list(memcheck.CFLAGS)}
    survivor = {"status": "survived", "setting": without}
    assert missing_tiers(survivor, with_it) == [MEMCHECK]
    assert missing_tiers({**survivor, "status": "killed"}, with_it) is None  # a kill stands
    assert missing_tiers({**survivor, "setting": {**without, "budget": 30.0}}, with_it) is None  # hunt again
    assert missing_tiers({"status": "survived", "setting": with_it}, with_it) is None
    assert missing_tiers(survivor, without) is None


def test_the_hunt_refuses_to_start_without_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compiler that has no libasan prints the bare name back: the hunt stops before building anything."""
    fake = tmp_path / "cc-without-asan"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -print-file-name=*) echo "${a#*=}";; esac; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(memcheck.RuntimeMissing, match=r"libasan\.so.*--no-memcheck"):
        memcheck.runtime()
    work = tmp_path / "work"
    data: dict[str, Any] = {"results": {}, "campaigns": [], "file_sha256": {}}
    some = mutants(SOURCES / "slots.c")[:1]
    assert hunt_all(_args("--workdir", str(work), some[0].id), some, data) == 2
    assert "AddressSanitizer's runtime" in capsys.readouterr().err
    assert not (work / "objects").exists() and data["results"] == {}
    # Without the tier the hunter starts (and has no memcheck stage).
    assert MEMCHECK not in Hunter(_args("--no-memcheck"), work).tiers()


def _gap() -> Mutant:
    """The hunt's one known gap: host_row_sync zeroes the copy mark of one table past the slot's own."""
    found = [m for m in mutants(SOURCES / "hosttab.c") if m.id == "hosttab.c:122:27:lt_to_le"]
    assert len(found) == 1 and found[0].function == "host_row_sync", found
    return found[0]


GROWTH_TEST = "tests/impl/test_block_table.py::test_rows_follow_tables_past_the_first_64_requests"


@needs_sanitizers
@needs_torch
def test_the_planted_gap_is_killed_by_the_memcheck_tier(tmp_path: Path) -> None:
    """The unmutated sanitized core passes the test that fills the core's first 64 slots; the gap
    mutant writes past the tables array there, which the sanitized build reports every time. (The
    plain build's fast tier usually passes it, but a write past an allocation may also corrupt the
    heap and crash the plain build, depending on the allocator's layout: seen once in a full suite.)"""
    hunter = Hunter(_args("--fast-tests", GROWTH_TEST, "--targets", ""), tmp_path)
    assert hunter.memcheck_stage is not None and hunter.tiers() == [FAST, MEMCHECK]
    stage = Stage(tmp_path)
    stage.prepare()
    hunter.memcheck_stage.prepare()
    assert stage.build(None).ok and hunter.memcheck_stage.build(None).ok
    log = tmp_path / "unmutated.log"
    code, _ = hunter.run_tier(hunter.memcheck_stage.root, MEMCHECK, None, log)
    assert code == 0, log.read_text()[-3000:]
    gap = _gap()
    reach = {
        t: TierReach({gap.file: frozenset({gap.function})}, {gap.file: frozenset({gap.line})}) for t in hunter.tiers()
    }
    record = hunter.hunt(stage, gap, reach)
    assert record["status"] == "killed", record
    if record["tiers"][FAST]["verdict"] == "survived":  # the usual case: no behavioural check sees it
        assert record["killed_by"] == MEMCHECK, record
        assert "AddressSanitizer: heap-buffer-overflow: WRITE of size 4 in host_row_sync (hosttab.c:" in record["how"]
    # whatever the plain build did, the sanitized build of the mutant reports the write
    assert hunter.memcheck_stage.build(gap).ok
    log = tmp_path / "gap.log"
    code, _ = hunter.run_tier(hunter.memcheck_stage.root, MEMCHECK, None, log)
    assert code != 0 and "heap-buffer-overflow" in log.read_text(), log.read_text()[-3000:]


@needs_sanitizers
def test_the_native_core_is_clean_under_the_sanitizers(tmp_path: Path) -> None:
    """The unmutated core, built with -fsanitize=address,undefined, runs every test of the hunt's fast
    tier (the unit tests that drive it) without a report: no access out of bounds or after free, no
    undefined behaviour on those paths. (The memcheck tier's own check of the unmutated core.)"""
    hunter = Hunter(_args(), tmp_path)
    assert hunter.memcheck_stage is not None
    hunter.memcheck_stage.prepare()
    assert hunter.memcheck_stage.build(None).ok
    log = tmp_path / "memcheck.log"
    code, _ = hunter.run_tier(hunter.memcheck_stage.root, MEMCHECK, None, log)
    output = log.read_text(errors="replace")
    assert code == 0, f"{memcheck.first_report(output)}\n{output[-4000:]}"
    assert memcheck.first_report(output) is None
    assert len(hunter.fast_tests) == len(FAST_TESTS) and os.path.exists(hunter.fast_tests[0])
