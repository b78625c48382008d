"""The C mutants runner (kvtools.cmutants): the build's flags, sampling, verdicts, the score, and one
planted mutant that the fast tier kills (a staging build in a temporary folder; the checkout's
extension is never touched)."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import subprocess
import sysconfig
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvtools.cmutants.build import ROOT, SOURCES, Stage, compile_command, extension_name, link_command
from kvtools.cmutants.child import NOT_LOADED, WRONG_STAGE
from kvtools.cmutants.generate import Mutant, mutants, mutants_of
from kvtools.cmutants.reach import TierReach
from kvtools.cmutants.report import file_score, stratified_score, wilson
from kvtools.cmutants.runner import FAST, Hunter, fast_tests_digest, judge, stratified_sample, to_hunt

HAS_CC = shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0]) is not None


def test_commands_are_hatch_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compile and the link are the commands hatch_build.compile_extension runs."""
    spec = importlib.util.spec_from_file_location("hatch_build_under_test", ROOT / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    hatch_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hatch_build)
    ran: list[list[str]] = []

    def record(cmd: list[str], check: bool = False) -> subprocess.CompletedProcess[bytes]:
        ran.append(list(cmd))
        Path(cmd[-1]).write_bytes(b"")  # the -o output, so that the final rename finds it
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(hatch_build.subprocess, "run", record)
    hatch_build.compile_extension(tmp_path / extension_name())
    sources = sorted(SOURCES.glob("*.c"))
    *compiles, link = ran
    assert len(compiles) == len(sources)
    for cmd, src in zip(compiles, sources, strict=True):
        assert cmd == compile_command(src, Path(cmd[-1]))
    assert link == link_command([Path(c[-1]) for c in compiles], Path(link[-1]))


def _fake(file: str, n: int) -> list[Mutant]:
    return [Mutant(file, i + 1, 1, "negate_if", "f", i, i + 1, "x", "y") for i in range(n)]


def test_the_sample_is_stratified_deterministic_and_nested() -> None:
    every = {"a.c": _fake("a.c", 300), "b.c": _fake("b.c", 100), "c.c": _fake("c.c", 7)}
    small = stratified_sample(every, 40, seed=3)
    assert small == stratified_sample(every, 40, seed=3)
    assert len(small) == 40
    per_file = {f: sum(m.file == f for m in small) for f in every}
    assert per_file == {"a.c": 29, "b.c": 10, "c.c": 1}  # 29.5, 9.8, 0.7: the largest remainders round up
    big = stratified_sample(every, 120, seed=3)
    assert {m.id for m in small} <= {m.id for m in big}  # a larger sample contains a smaller one
    assert stratified_sample(every, 40, seed=4) != small
    assert len(stratified_sample(every, 10_000, seed=0)) == 407


def test_what_is_hunted_again() -> None:
    """A mutant without a result and a survivor of other tiers are hunted; a kill and a survivor
    of the same tiers are not, unless named by id."""
    done, alive, other, new = _fake("a.c", 4)
    setting = {"fast_tests": ["t.py"], "targets": [], "budget": 60.0}
    results = {
        done.id: {"status": "killed", "setting": {}},
        alive.id: {"status": "survived", "setting": setting},
        other.id: {"status": "survived", "setting": {**setting, "fast_tests": ["u.py"]}},
    }
    assert to_hunt([done, alive, other, new], results, setting, named=False) == [other, new]
    assert to_hunt([done, alive], results, setting, named=True) == [done, alive]


def test_the_reach_key_follows_the_fast_tests_contents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edited fast-tier file may enter other functions: its digest changes, so reach is measured again."""
    from kvtools.cmutants import runner  # noqa: PLC0415

    monkeypatch.setattr(runner, "ROOT", tmp_path)
    (tmp_path / "t.py").write_text("def test_a(): pass\n")
    before = fast_tests_digest(["t.py"])
    assert fast_tests_digest(["t.py"]) == before
    (tmp_path / "t.py").write_text("def test_a(): pass\ndef test_b(): pass\n")
    assert fast_tests_digest(["t.py"]) != before


@pytest.mark.parametrize(
    ("tier", "code", "output", "verdict", "how"),
    [
        (FAST, 0, "", "survived", ""),
        (FAST, 1, "FAILED tests/impl/test_native.py::test_x - assert 1 == 2", "killed", "test_native.py::test_x"),
        (FAST, -signal.SIGSEGV, "", "killed", "crash (SIGSEGV)"),
        (FAST, None, "", "timeout", "hang guard"),
        (
            FAST,
            NOT_LOADED,
            "cmutants child: the mutant extension does not import: undefined symbol",
            "killed",
            "does not import",
        ),
        (FAST, WRONG_STAGE, "cmutants child: kvimpl was imported from elsewhere", "error", "elsewhere"),
        (FAST, 4, "usage", "error", "pytest exit 4"),
        ("impl-native", 0, "", "survived", ""),
        ("impl-native", 1, "allocate_slots: kvimpl [1] != kvspec [2]", "killed", "divergence"),
        ("impl-array", -signal.SIGABRT, "", "killed", "impl-array: crash (SIGABRT)"),
        ("impl-native", 4, "", "killed", "exit 4"),
        ("impl-native", 2, "bad option", "error", "kvref exit 2"),
    ],
)
def test_verdicts(tier: str, code: int | None, output: str, verdict: str, how: str) -> None:
    got_verdict, got_how = judge(tier, code, output)
    assert got_verdict == verdict
    assert how in got_how


def test_scores_and_intervals() -> None:
    assert (
        file_score(4, ["killed", "killed", "timeout", "gap"]).text().startswith("3/4 = 75.0% (95% interval 75.0-75.0%)")
    )
    sampled = file_score(100, ["killed"] * 19 + ["untriaged", "equivalent", "invalid"])
    assert sampled.estimate == pytest.approx(0.95)
    assert sampled.low is not None and sampled.low < 0.95 < (sampled.high or 0)
    low, high = wilson(20, 20)
    assert high == 1.0 and 0.8 < low < 0.9  # no failure in 20 does not prove 100 %
    # Two strata: a census of 10 (all killed) and 10 of 1,000 sampled (one gap): the big file dominates.
    overall = stratified_score([(10, ["killed"] * 10), (1000, ["killed"] * 9 + ["gap"])])
    assert overall.estimate == pytest.approx((10 + 900) / (10 + 1000))
    assert overall.low is not None and overall.estimate is not None and overall.low < overall.estimate
    perfect = stratified_score([(50, ["killed"] * 10), (20, ["equivalent", "killed"])])
    assert perfect.estimate == 1.0 and perfect.low is not None and perfect.low < 1.0  # Wilson, not a 0-width interval


def _planted() -> Mutant:
    """The fault to plant: ``c->nfree -= n`` of pool_get_new_blocks becomes ``+=`` (found by what it is,
    not by its line, so that edits elsewhere in pool.c do not move it)."""
    found = [
        m
        for m in mutants(SOURCES / "pool.c")
        if m.function == "pool_get_new_blocks" and m.operator == "sub_to_add_assign"
    ]
    assert len(found) == 1, found
    return found[0]


def _hunter(work: Path, tests: str) -> Hunter:
    args = argparse.Namespace(budget=60.0, targets="", fast_tests=tests, fast_guard=600.0, lockstep_guard=None)
    return Hunter(args, work)


KILLING_TEST = "tests/impl/test_native.py::test_native_events_are_the_python_managers"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_a_planted_mutant_is_killed_by_the_fast_tier(tmp_path: Path) -> None:
    """The unmutated staging build passes the test, the mutant fails it; a mutant that does not
    compile is invalid; the checkout's own extension is left alone."""
    own = sorted(p.stat().st_mtime_ns for p in (ROOT / "impl" / "kvimpl").glob("_kvnative*"))
    stage = Stage(tmp_path)
    stage.prepare()
    hunter = _hunter(tmp_path, KILLING_TEST)
    assert stage.build(None).ok
    code, _ = hunter.run_tier(stage.root, FAST, None, tmp_path / "unmutated.log")
    assert code == 0, (tmp_path / "unmutated.log").read_text()[-2000:]
    mutant = _planted()
    reach = {FAST: TierReach({mutant.file: frozenset({mutant.function})}, {mutant.file: frozenset({mutant.line})})}
    record: dict[str, Any] = hunter.hunt(stage, mutant, reach)
    assert record["status"] == "killed", record
    assert record["killed_by"] == FAST and "test_native_events_are_the_python_managers" in record["how"]
    broken = replace(mutant, operator="delete_statement", replacement="(((")
    assert hunter.hunt(stage, broken, reach)["status"] == "invalid"
    # A tier that never enters the function is not run: the mutant survives untouched.
    elsewhere = {FAST: TierReach({mutant.file: frozenset({"other"})}, {})}
    skipped = hunter.hunt(stage, mutant, elsewhere)
    assert skipped["status"] == "survived" and skipped["tiers"] == {} and "no tier enters" in skipped["how"]
    assert sorted(p.stat().st_mtime_ns for p in (ROOT / "impl" / "kvimpl").glob("_kvnative*")) == own


def test_mutants_of_a_snippet_compile_with_the_builds_flags(tmp_path: Path) -> None:
    """Every mutant of a small C file compiles (the generator stays inside C's grammar)."""
    if not HAS_CC:
        pytest.skip("no C compiler here")
    source = (
        "int f(int *a, int n) {\n    int i = 0;\n    if (n < 0 || !a)\n        return -1;\n"
        "    for (i = 0; i <= n - 1; i++)\n        a[i] += 1;\n    while (n > 1 && n != 2)\n        n--;\n"
        "    return 0;\n}\n"
    )
    found = list(mutants_of(source, "snippet.c"))
    assert len(found) >= 15
    for m in found:
        path = tmp_path / "snippet.c"
        path.write_text(m.apply(source))
        proc = subprocess.run(
            compile_command(path, tmp_path / "snippet.o"), capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, (m.id, proc.stderr)


def test_the_report_counts_triages_and_flags_stale_entries(tmp_path: Path) -> None:
    every = {"a.c": _fake("a.c", 4), "b.c": _fake("b.c", 2)}
    a = every["a.c"]

    def record(m: Mutant, status: str, how: str = "") -> dict[str, Any]:
        return {"file": m.file, "line": m.line, "col": m.col, "operator": m.operator, "function": m.function,
                "change": m.describe(), "status": status, "how": how, "build_seconds": 1.0,
                "tiers": {FAST: {"exit": 1, "seconds": 2.0, "verdict": status}}, "killed_by": FAST}  # fmt: skip

    data: dict[str, Any] = {
        "results": {
            a[0].id: record(a[0], "killed", "fast: crash (SIGSEGV)"),
            a[1].id: record(a[1], "survived"),
            a[2].id: record(a[2], "survived"),
            a[3].id: record(a[3], "invalid", "error: expected ';'"),
        },
        "campaigns": [{"command": "python -m kvtools cmutants --files a.c"}],
    }
    triage = tmp_path / "triage.toml"
    triage.write_text(f'[equivalent]\n"{a[1].id}" = "never read"\n"{a[0].id}" = "stale"\n[gap]\n')
    out = tmp_path / "report.md"
    from kvtools.cmutants.report import write_report  # noqa: PLC0415

    write_report(data, every, triage, out)
    text = out.read_text()
    assert "| `a.c` | 4 | 4 | 1 | 0 | 1 | 0 | 1 | 1 | 1/2 = 50.0% (95% interval 50.0-50.0%) |" in text
    assert "| `b.c` | 2 | 0 |" in text
    assert f"`{a[0].id}`: now killed (drop it from the triage file)" in text
    assert "**untriaged**" in text and "never read" in text
    assert data["summary"]["classes"] == {"equivalent": 1, "invalid": 1, "killed": 1, "untriaged": 1}


def test_every_triaged_id_names_a_mutant_of_the_current_sources() -> None:
    """A triage entry keyed by file:line:col:operator goes stale when its file
    is edited above it (a line moves); an id that no longer names a mutant is
    caught here (one that moved onto another mutant of the same operator is
    not: re-read the entries of a file whenever its mutants are hunted again)."""
    import tomllib  # noqa: PLC0415 - this test only

    from kvtools.cmutants.report import TRIAGE  # noqa: PLC0415 - this test only

    data = tomllib.loads(TRIAGE.read_text())
    ids = {m.id for path in sorted(SOURCES.glob("*.c")) for m in mutants(path)}
    entries = [k for section in ("equivalent", "gap") for k in data.get(section, {})]
    assert entries
    assert [k for k in entries if k not in ids] == []
