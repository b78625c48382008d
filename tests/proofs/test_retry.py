"""The retry of a CrossHair process that left a condition "Not confirmed"
(kvproofs.run.retry_unexhausted): fast, no CrossHair process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproofs import run

WHERE = Path("build/proofs/generated/contracts/_contracts__x.py")


def result(*texts: tuple[str, str]) -> run.Result:
    r = run.Result("f__contract", ["crosshair"], 0, "", "", 1.0, 1.0)
    r.messages = [(WHERE, 10 + i, level, text) for i, (level, text) in enumerate(texts)]
    return r


CONFIRMED = ("info", "Confirmed over all paths.")
NOT_CONFIRMED = ("info", "Not confirmed.")
REFUTED = ("error", "false when calling f(1)")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """Each retry's environment overrides; the retry answers what ``answers`` holds."""
    seen: list[dict[str, str]] = []

    def fake(label: str, args: list[str], extra: list[Path], env: dict[str, str]) -> run.Result:
        seen.append(dict(env))
        return answers[0]

    monkeypatch.setattr(run, "run_crosshair", fake)
    return seen


answers: list[run.Result] = []


def test_an_exhausted_run_is_not_retried(calls: list[dict[str, str]]) -> None:
    first = result(CONFIRMED, CONFIRMED)
    assert run.retry_unexhausted(first, ["check"], []) is first
    assert calls == []


def test_a_refutation_is_never_retried(calls: list[dict[str, str]]) -> None:
    first = result(NOT_CONFIRMED, REFUTED)
    assert run.retry_unexhausted(first, ["check"], []) is first
    assert calls == []


def test_an_exhaustive_retry_replaces_the_first_run(calls: list[dict[str, str]]) -> None:
    answers[:] = [result(CONFIRMED, CONFIRMED)]
    first = result(CONFIRMED, NOT_CONFIRMED)
    assert run.retry_unexhausted(first, ["check"], []) is answers[0]
    assert calls == [run.RETRY_ENV]
    assert run.RETRY_ENV["PYTHONHASHSEED"] != "0"
    assert int(run.RETRY_ENV["CROSSHAIR_SMT_RLIMIT"]) > run.SMT_RLIMIT


@pytest.mark.parametrize("retry", [(NOT_CONFIRMED, CONFIRMED), (CONFIRMED, REFUTED)])
def test_a_retry_that_does_not_settle_keeps_the_first_run(
    calls: list[dict[str, str]], retry: tuple[tuple[str, str], ...]
) -> None:
    answers[:] = [result(*retry)]
    first = result(CONFIRMED, NOT_CONFIRMED)
    assert run.retry_unexhausted(first, ["check"], []) is first
    assert len(calls) == 1
