"""The branch report of ``kvref check --coverage`` and ``python -m kvtools coverage``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvimpl.native import native_module, native_unsupported
from kvref.adapters.impl import IMPL_PROFILES
from kvref.branches import Unreachable, build_report, function_lines, load_unreachable, package_relative
from kvref.config_coverage import NAMES
from kvref.shapes import MTP_SHAPES as CATALOG_MTP_SHAPES
from kvref.shapes import WIDE, build_kinds, shape_allowed, shape_named
from kvspec.config import KVCacheConfig
from kvspec.profiles import NEWEST, VLLM_0_25_1, SemanticsProfile, profile_named
from kvtools.coverage import (
    CHUNKED_SHAPES,
    CHUNKED_STEPS,
    CONNECTOR_NATIVE_PROFILE,
    EAGLE_WINDOW_PROFILE,
    EAGLE_WINDOW_SHAPES,
    MAMBA_SHAPES,
    MTP_SHAPES,
    PAST_HASHES_SHAPES,
    PAST_HASHES_STEPS,
    PCP_MAMBA_DCP_PROFILE,
    PCP_MAMBA_SHAPE,
    PCP_MAMBA_STEPS,
    PROMPT_END_PROFILE,
    PROMPT_END_SHAPES,
    PROMPT_END_STEPS,
    REKEYED_SHAPES,
    REKEYED_STEPS,
    RING_SHAPES,
    SINK_PROFILE,
    SINK_SHAPES,
    SINK_STEPS,
    WIDE_STEPS,
    Run,
    behaviours,
    ci_runs,
    main,
    parse_profiles,
    parse_seeds,
    source_lines,
)
from kvtools.coverage_gate import KnownGap, gaps_of, gate, load_gaps, merge_runs, relocate, write_gaps

SOURCE = """\
import os
if os.name:
    X = 1


def f(a):
    if a:
        return 1
    return 2


def g(b):
    while b:
        b -= 1
"""


def _raw(path: Path) -> dict[str, object]:
    return {
        "files": {
            str(path): {
                "summary": {"num_branches": 6, "covered_branches": 2},
                "missing_branches": [[2, 3], [7, 8], [13, 14], [13, -12]],
            }
        }
    }


def test_gaps_listed_and_import_time(tmp_path: Path) -> None:
    path = tmp_path / "kvspec" / "m.py"
    path.parent.mkdir()
    path.write_text(SOURCE)
    listed = [Unreachable("kvspec/m.py", 7, 8, "if a:", "argued")]
    report = build_report(_raw(path), listed)
    fb = report.files["kvspec/m.py"]
    assert (fb.total, fb.taken, fb.import_time) == (6, 2, 1)
    assert fb.unreachable == [(7, 8)]
    assert fb.gaps == [(13, 14), (13, -12)]
    assert report.gap_lines() == ["kvspec/m.py:13->exit  while b:", "kvspec/m.py:13->14  while b:"]
    assert report.totals == {"outcomes": 6, "taken": 2, "import_time": 1, "unreachable": 1, "gaps": 2, "stale": 0}


def test_stale_entries_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "kvspec" / "m.py"
    path.parent.mkdir()
    path.write_text(SOURCE)
    moved = Unreachable("kvspec/m.py", 7, 8, "if b:", "argued")
    taken = Unreachable("kvspec/m.py", 8, 9, "return 1", "argued")
    report = build_report(_raw(path), [moved, taken])
    assert len(report.stale) == 2
    assert "now reads 'if a:'" in report.stale[0] and "taken in this run" in report.stale[1]
    assert report.files["kvspec/m.py"].gaps == [(7, 8), (13, 14), (13, -12)]


def test_helpers() -> None:
    assert package_relative("/x/spec/kvspec/pool.py") == "kvspec/pool.py"
    assert package_relative("/x/kit/kvref/ops.py") is None
    assert 7 in function_lines(SOURCE) and 2 not in function_lines(SOURCE)
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4] and parse_seeds("0,2") == [0, 2]


def test_listed_file_parses_and_quotes_its_lines() -> None:
    """Every listed outcome names a decision whose source line still reads as recorded."""
    root = Path(__file__).resolve().parents[2]
    entries = load_unreachable()
    assert entries
    for e in entries:
        src = (root / ("spec" if e.file.startswith("kvspec") else "impl") / e.file).read_text().splitlines()
        assert src[e.line - 1].strip() == e.code, e
        assert e.why


def _run(gaps: list[list[int]], unreachable: list[list[int]], stale: list[str], exit_code: int) -> dict[str, object]:
    taken = 10 - 1 - len(gaps) - len(unreachable)
    files = {
        "kvimpl/m.py": {"outcomes": 10, "taken": taken, "import_time": 1, "unreachable": unreachable, "gaps": gaps}
    }
    return {"totals": {}, "stale": stale, "files": files, "exit": exit_code, "seconds": 1.5}


def test_merge_runs_keeps_what_no_run_took() -> None:
    impl = _run([[3, 4], [5, 6], [7, 8]], [[1, 2]], ["kvimpl/m.py:9->10 (x): taken in this run"], 0)
    batch = _run([[3, 4], [9, 10]], [[1, 2]], [], 1)
    merged = merge_runs([impl, batch])
    assert merged["files"] == {
        "kvimpl/m.py": {"outcomes": 10, "taken": 7, "import_time": 1, "unreachable": [[1, 2]], "gaps": [[3, 4]]}
    }
    assert merged["totals"] == {"outcomes": 10, "taken": 7, "import_time": 1, "unreachable": 1, "gaps": 1, "stale": 1}
    assert (merged["exit"], merged["seconds"]) == (1, 3.0)
    assert merge_runs([impl]) is impl


def test_merge_over_profiles_takes_an_outcome_any_profile_took() -> None:
    """Three profiles' runs, each missing a different outcome of a shared pair: only the outcome
    all three miss stays a gap, and a stale entry of one profile's run is stale in the merge."""
    old = _run([[3, 4], [5, 6]], [[1, 2]], [], 0)
    mid = _run([[3, 4], [7, 8]], [[1, 2]], ["kvimpl/m.py:1->2 (x): taken in this run"], 0)
    new = _run([[3, 4], [5, 6], [7, 8]], [[1, 2]], [], 0)
    merged = merge_runs([old, mid, new])
    assert merged["files"]["kvimpl/m.py"]["gaps"] == [[3, 4]]
    assert merged["totals"]["taken"] == 7 and merged["totals"]["stale"] == 1
    assert merged["seconds"] == 4.5


SRC = {"kvimpl/m.py": ["def f(a):", "    if a:", "        return 1", "    while a:", "        a -= 1"]}


def _lines(name: str) -> list[str]:
    return SRC.get(name, [])


def _report(gaps: list[list[int]], stale: list[str] = [], exit_code: int = 0) -> dict[str, object]:  # noqa: B006
    return _run(gaps, [], stale, exit_code)


def test_gate_passes_when_the_gaps_are_the_known_ones() -> None:
    report = _report([[2, 3], [4, -1]])
    known = gaps_of(report, _lines)
    assert known == [KnownGap("kvimpl/m.py", 2, 3, "if a:"), KnownGap("kvimpl/m.py", 4, -1, "while a:")]
    assert gate(report, known, _lines) == []


def test_gate_fails_on_a_new_gap() -> None:
    known = [KnownGap("kvimpl/m.py", 2, 3, "if a:")]
    problems = gate(_report([[2, 3], [4, 5]]), known, _lines)
    assert problems == ["new gap kvimpl/m.py:4->5  while a:: take it or argue it unreachable"]


def test_gate_fails_on_a_known_gap_now_taken() -> None:
    known = [KnownGap("kvimpl/m.py", 2, 3, "if a:"), KnownGap("kvimpl/m.py", 4, -1, "while a:")]
    problems = gate(_report([[2, 3]]), known, _lines)
    assert len(problems) == 1 and problems[0].startswith("known gap closed kvimpl/m.py:4->exit")


def test_gate_fails_on_a_known_gap_whose_line_moved() -> None:
    known = [KnownGap("kvimpl/m.py", 2, 3, "if b:")]
    problems = gate(_report([[2, 3]]), known, _lines)
    assert problems == ["stale known gap kvimpl/m.py:2->3  if b:: line 2 now reads 'if a:' (regenerate the list)"]


def test_gate_fails_on_a_stale_unreachable_entry_or_a_failed_run() -> None:
    problems = gate(_report([], ["kvimpl/m.py:2->3 (if a:): taken in this run"], exit_code=1), [], _lines)
    assert len(problems) == 2
    assert "exited 1" in problems[0] and "unreachable_branches.toml" in problems[1]


def test_gate_fails_on_a_configuration_class_no_run_took() -> None:
    """The merged runs must take every class of kvref.config_coverage (any run may take it)."""
    first, second = _report([]), _report([])
    first["config_properties"] = list(NAMES[:-1])
    second["config_properties"] = [NAMES[0]]
    merged = merge_runs([first, second])
    assert gate(merged, [], _lines) == [f"configuration class not taken by any run: {NAMES[-1]}"]
    second["config_properties"] = [NAMES[-1]]
    assert gate(merge_runs([first, second]), [], _lines) == []


def test_known_gaps_round_trip(tmp_path: Path) -> None:
    gaps = [KnownGap("kvspec/a.py", 9, -3, 'if x == "a\\b" or y:'), KnownGap("kvimpl/b.py", 1, 2, "for é in s:")]
    path = tmp_path / "gaps.toml"
    write_gaps(gaps, path)
    assert load_gaps(path) == sorted(gaps)
    assert load_gaps(tmp_path / "absent.toml") == []


def test_merge_mode_checks_reports_against_the_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--merge A B --check``: exit 0 when the merged gaps are the list, 1 after one more gap."""
    import kvtools.coverage as cov  # noqa: PLC0415

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report([[2, 3], [4, 5]])))
    b.write_text(json.dumps(_report([[2, 3]])))
    gaps_file = tmp_path / "gaps.toml"
    write_gaps([KnownGap("kvimpl/m.py", 2, 3, "if a:")], gaps_file)
    monkeypatch.setattr(cov, "source_lines", _lines)
    monkeypatch.setattr(cov, "load_gaps", lambda: load_gaps(gaps_file))
    assert main(["--merge", str(a), str(b), "--check"]) == 0
    b.write_text(json.dumps(_report([[2, 3], [4, 5]])))
    assert main(["--merge", str(a), str(b), "--check"]) == 1


def test_ci_runs_cover_every_profile() -> None:
    runs = ci_runs()
    full = {r.profile for r in runs if r.target == "impl" and r.native and r.shapes is None and not r.asynchronous}
    assert full == set(behaviours(IMPL_PROFILES))
    assert Run(VLLM_0_25_1.name, "impl", native=False) in runs
    assert Run(NEWEST.name, "impl-mutable") in runs
    assert Run(NEWEST.name, "impl-batch") in runs
    assert Run(NEWEST.name, "impl-batch-native") in runs
    assert Run(NEWEST.name, "impl", shapes="wide", min_steps=WIDE_STEPS) in runs
    assert Run(NEWEST.name, "impl", shapes=PCP_MAMBA_SHAPE, min_steps=PCP_MAMBA_STEPS) in runs
    assert Run(PCP_MAMBA_DCP_PROFILE, "impl", shapes=PCP_MAMBA_SHAPE, min_steps=PCP_MAMBA_STEPS) in runs
    assert Run(NEWEST.name, "impl", shapes=REKEYED_SHAPES, min_steps=REKEYED_STEPS) in runs
    assert Run(NEWEST.name, "impl-batch", shapes=CHUNKED_SHAPES, min_steps=CHUNKED_STEPS) in runs
    assert Run(SINK_PROFILE, "impl", shapes=SINK_SHAPES, min_steps=SINK_STEPS) in runs
    assert Run(NEWEST.name, "impl", shapes=RING_SHAPES) in runs
    assert Run(NEWEST.name, "impl", shapes=MAMBA_SHAPES) in runs
    assert Run(CONNECTOR_NATIVE_PROFILE, "impl", shapes=MAMBA_SHAPES) in runs
    assert Run(EAGLE_WINDOW_PROFILE, "impl", shapes=EAGLE_WINDOW_SHAPES) in runs
    assert Run(NEWEST.name, "impl", shapes=MTP_SHAPES) in runs
    assert Run(PROMPT_END_PROFILE, "impl", shapes=PROMPT_END_SHAPES, min_steps=PROMPT_END_STEPS) in runs
    past_hashes = Run(NEWEST.name, "impl", shapes=PAST_HASHES_SHAPES, min_steps=PAST_HASHES_STEPS, asynchronous=True)
    assert past_hashes in runs
    assert [r for r in runs if r.asynchronous] == [past_hashes]  # the others run synchronously, as before
    assert MTP_SHAPES.split(",") == [s.name for s in CATALOG_MTP_SHAPES]  # every MTP shape, nothing else
    assert parse_profiles("newest") == [NEWEST.name]
    assert set(parse_profiles("all")) == IMPL_PROFILES
    with pytest.raises(SystemExit):
        parse_profiles("vllm-9.9.9")


def test_behaviours_keep_one_profile_per_set_of_switches() -> None:
    """Every profile kvimpl follows has its switches run: by itself, or by the newest
    release that shares them; no two kept profiles share their switches."""
    kept = behaviours(IMPL_PROFILES)

    def switches(name: str) -> SemanticsProfile:
        return replace(profile_named(name), name="", release="")

    assert {switches(n) for n in IMPL_PROFILES} == {switches(n) for n in kept}
    assert len({switches(n) for n in kept}) == len(kept)
    assert VLLM_0_25_1.name in kept and NEWEST.name in kept
    assert "vllm-0.18.1" in kept and "vllm-0.17.1" not in kept and "vllm-0.18.0" not in kept
    assert behaviours(["vllm-0.17.1"]) == ["vllm-0.17.1"]


def test_the_focused_runs_name_shapes_their_profile_has() -> None:
    """The sink run's profile is one whose sink managers reserve their blocks (the refusal it
    exists for), and every shape a focused run names is one ``--shapes`` parses."""
    assert profile_named(SINK_PROFILE).sink_blocks_reserved
    assert not NEWEST.sink_blocks_reserved
    for run in ci_runs():
        for name in (run.shapes or "").split(","):
            if name:
                assert shape_allowed(shape_named(name), profile_named(run.profile)), (run, name)


def test_known_gaps_file_quotes_its_lines() -> None:
    """Every committed known gap names a decision whose source line still reads as recorded,
    and none is also listed unreachable."""
    listed = {(e.file, e.line, e.to) for e in load_unreachable()}
    for g in load_gaps():
        src = source_lines(g.file)
        assert 0 < g.line <= len(src) and src[g.line - 1].strip() == g.code, g
        assert (g.file, g.line, g.to) not in listed, g


def test_the_wide_shape_is_past_the_native_core() -> None:
    """CI's ``wide`` run exists to run kvimpl's pure-Python fallback: the native
    core refuses that many groups (with the core built), and the lines CI reads
    name the shape, the step goal and the scheduling."""
    cfg = KVCacheConfig(num_blocks=300, groups=build_kinds(WIDE, 4), max_model_len=32)
    reason = native_unsupported(cfg)
    assert reason is not None
    if native_module() is not None:
        assert reason == "65 groups (the native core takes up to 64)"
    assert Run(NEWEST.name, "impl", shapes="wide", min_steps=7).ci_line() == f"{NEWEST.name} impl native wide 7 sync"
    assert Run(NEWEST.name, "impl").ci_line() == f"{NEWEST.name} impl native - - sync"
    assert Run(NEWEST.name, "impl", asynchronous=True).ci_line() == f"{NEWEST.name} impl native - - async"
    assert Run(NEWEST.name, "impl", native=False, asynchronous=True).label == f"{NEWEST.name}/impl+pure-python+async"


def test_out_keeps_each_runs_report_for_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--out DIR`` each run's own report stays in ``DIR/runs/`` (so a later ``--merge``
    can combine it with other runs), next to the merged coverage.md and coverage.json."""
    import subprocess  # noqa: PLC0415

    import kvtools.coverage as cov  # noqa: PLC0415

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        report = _report([[2, 3]])
        report["totals"] = {"outcomes": 10, "taken": 8, "import_time": 1, "unreachable": 0, "gaps": 1, "stale": 0}
        Path(cmd[cmd.index("--coverage-json") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(cov, "source_lines", _lines)
    out = tmp_path / "out"
    assert main(["--profiles", "newest", "--targets", "impl,impl-batch", "--seeds", "0-1", "--out", str(out)]) == 0
    kept = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert len(kept) == 4 and all(name.startswith(("seed-0-", "seed-1-")) for name in kept)
    assert (out / "coverage.md").exists() and (out / "coverage.json").exists()
    assert main(["--merge", *map(str, (out / "runs").glob("seed-0-*.json")), "--out", str(tmp_path / "m")]) == 0


def test_an_asynchronous_run_schedules_asynchronously(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with ``asynchronous`` passes ``--async-scheduling`` to ``kvref check`` (and keeps a
    report of its own next to the synchronous run of the same profile, target and shapes); a
    synchronous run does not."""
    import subprocess  # noqa: PLC0415

    from kvtools.coverage import run_seed  # noqa: PLC0415

    commands: list[list[str]] = []

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        commands.append(cmd)
        report = _report([[2, 3]])
        report["totals"] = {"outcomes": 10, "taken": 8, "import_time": 1, "unreachable": 0, "gaps": 1, "stale": 0}
        Path(cmd[cmd.index("--coverage-json") + 1]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    run_seed(0, tmp_path, Run(NEWEST.name, "impl", shapes="full", asynchronous=True), None)
    run_seed(0, tmp_path, Run(NEWEST.name, "impl", shapes="full"), None)
    assert ["--async-scheduling" in cmd for cmd in commands] == [True, False]
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_relocate_moves_entries_with_their_code(tmp_path: Path) -> None:
    """An entry whose code moved follows it (its exit target too); a lost one is reported and kept."""
    listed = tmp_path / "list.toml"
    listed.write_text(
        '# header\n\n[[gap]]\nfile = "kvimpl/m.py"\nline = 2\nto = -1\ncode = "if x:"\n\n'
        '[[gap]]\nfile = "kvimpl/m.py"\nline = 3\nto = 4\ncode = "while y:"\n'
    )
    source = ["def f():", "", "", "    if x:", "        pass"]
    notes = relocate(listed, lambda name: source)
    text = listed.read_text()
    assert text.startswith("# header\n")
    assert "line = 4\nto = -3\n" in text
    assert "line = 3\nto = 4\n" in text
    assert notes == ["kvimpl/m.py:2->-1 moved to 4->-3", "kvimpl/m.py:3: 'while y:' is gone (review the entry)"]
