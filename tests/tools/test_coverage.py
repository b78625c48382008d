"""The branch report of ``kvref check --coverage`` and ``python -m kvtools coverage``."""

from __future__ import annotations

from pathlib import Path

from kvref.branches import Unreachable, build_report, function_lines, load_unreachable, package_relative
from kvtools.coverage import merge_runs, parse_seeds

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
