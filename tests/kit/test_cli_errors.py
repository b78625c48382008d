"""The ``kvref`` command never passes vacuously, never hangs, and answers bad
input with one line and the documented exit code (:mod:`kvref.exits`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.exits import HANG, NOTHING_CHECKED, OK, USAGE
from kvref.traces import Trace, load
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import UnsupportedByProfileError

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "traces" / "vllm-0.25.1" / "golden" / "full-0001.jsonl"


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.mark.parametrize("flag", [["--budget", "0"], ["--budget", "-5"], ["--min-steps", "-10"], ["--min-steps", "0"]])
def test_check_refuses_a_run_that_could_check_nothing(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["check", "--target", "spec", "--against", "none", *flag]) == USAGE
    assert "above 0" in capsys.readouterr().err


def _replay(paths: list[Path], capsys: pytest.CaptureFixture[str], target: str = "spec") -> tuple[int, str]:
    code = _exit_code(["replay", *map(str, paths), "--target", target])
    return code, capsys.readouterr().out


def test_replay_reports_each_bad_file_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jsonl"
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x80\x81\xfe\xff" * 8)
    not_json = tmp_path / "not-json.jsonl"
    lines = GOOD.read_text().splitlines(keepends=True)
    not_json.write_text(lines[0] + "{nope\n")
    code, out = _replay([missing, binary, not_json, GOOD], capsys)
    assert code == USAGE
    assert f"{missing}: ERROR: no such file" in out
    assert f"{binary}: ERROR: not a readable UTF-8 text file" in out
    assert f"{not_json}: ERROR:" in out and ":2: not JSON" in out
    assert f"{GOOD}: ok" in out
    assert "1/1 traces as expected against spec (3 errors)" in out


def test_replay_refuses_truncated_and_empty_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = GOOD.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-3]))  # cut at a line boundary
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join([lines[0], *lines[2:]]))  # a step removed, the end line kept
    header_only = tmp_path / "header-only.jsonl"
    Trace(load(GOOD).config, [], {}).write(header_only)
    code, out = _replay([cut, changed, header_only], capsys)
    assert code == USAGE
    assert "truncated" in out and "does not match the file" in out and "has no step" in out
    assert "0/0 traces" in out


def test_replay_refuses_unknown_kinds_and_huge_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = json.loads(GOOD.read_text().splitlines()[0])
    unknown = tmp_path / "unknown-kind.jsonl"
    bad = dict(header, config=dict(header["config"], groups=[{"kind": "Quantum", "block_size": 4}]), version=1)
    unknown.write_text(json.dumps(bad) + "\n")
    huge = tmp_path / "huge.jsonl"
    big = dict(header, config=dict(header["config"], num_blocks=10**8), version=1)
    huge.write_text(json.dumps(big) + "\n" + GOOD.read_text().splitlines(keepends=True)[1])
    started = time.monotonic()
    code, out = _replay([unknown, huge], capsys)
    assert code == USAGE
    assert "bad header" in out and "exceeds the limit" in out
    assert time.monotonic() - started < 60  # a hang guard, far above the ~0.1 s it takes


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("nope", "is not spec, impl, vllm or module:factory"),
        ("no_such_module_xyz:make", "cannot import"),
        ("kvref.traces:NOT_THERE", "has no callable"),
    ],
)
def test_bad_targets_are_one_line(bad: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["replay", str(GOOD), "--target", bad]) == USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def returns_none(config: KVCacheConfig) -> None:
    """A broken factory."""


def test_a_factory_returning_none_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{__name__}:returns_none"
    code = _exit_code(["check", "--target", target, "--against", "spec", "--min-steps", "10"])
    assert code == USAGE


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--engines", "bogus"], "not available"), (["--blocks", "1"], "cannot hold one request")],
)
def test_bench_refuses_what_cannot_run(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = _exit_code(["bench", "--requests", "4", "--repeats", "1", *flags])
    assert code == USAGE
    assert message in capsys.readouterr().err


class Hangs:
    """An adapter whose lookups never return (here: sleep far past the watchdog)."""

    name = "hangs"

    def __init__(self, config: KVCacheConfig) -> None:
        from kvref.adapters.spec import SpecAdapter  # noqa: PLC0415

        self._spec = SpecAdapter(config)

    def __getattr__(self, name: str) -> object:
        if name == "get_computed_blocks":

            def hang(*args: object) -> None:
                time.sleep(600)

            return hang
        return getattr(self._spec, name)


def test_a_hanging_adapter_ends_with_exit_4_and_its_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    started = time.monotonic()
    code = _exit_code(
        ["check", "--target", f"{__name__}:Hangs", "--against", "spec", "--op-timeout", "1", "--min-steps", "50"]
    )
    assert code == HANG
    assert time.monotonic() - started < 120  # a hang guard: the watchdog fires after 1 s
    (trace,) = tmp_path.glob("failure-*.jsonl")
    assert "hang" in json.loads(trace.read_text().splitlines()[0])["failure"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["--version"]) == OK
    assert "semantics profiles" in capsys.readouterr().out


def refuses_everything(config: KVCacheConfig) -> None:
    """A target factory that refuses every configuration, as an engine modelling none of them would."""
    raise UnsupportedByProfileError(f"this engine models no configuration (asked for {len(config.groups)} groups)")


def test_a_run_of_only_refused_configurations_checks_nothing() -> None:
    """Every configuration refused by the target is no pass: the run ends as a usage error or 'nothing checked'."""
    with pytest.raises(UnsupportedByProfileError):
        refuses_everything(KVCacheConfig(num_blocks=4, groups=(FullAttention(4),), max_model_len=16))
    code = _exit_code(["check", "--target", f"{__name__}:refuses_everything", "--against", "spec"])
    assert code in (USAGE, NOTHING_CHECKED)


def test_replay_takes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder stands for its .jsonl files (it once failed with an IsADirectoryError text); an empty one is a
    usage error of one line."""
    minimal = ROOT / "traces" / "vllm-0.25.1" / "minimal"
    assert _exit_code(["replay", str(minimal), "--target", "spec"]) == OK
    assert "12/12 traces as expected against spec" in capsys.readouterr().out
    assert _exit_code(["replay", str(tmp_path), "--target", "spec"]) == USAGE
    err = capsys.readouterr().err
    assert err.strip() == f"kvref replay: {tmp_path}: a folder without .jsonl trace files"


def test_replay_help_documents_its_arguments_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["replay", "--help"]) == OK
    out = capsys.readouterr().out
    documented = ("FILE", "folders", "--target", "--op-timeout", "Exit codes: 0", "3 nothing was", "4 an adapter")
    for text in documented:
        assert text in out, text
