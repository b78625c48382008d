"""pytest plugin: ``--kvref-target`` runs kvref's lockstep check on your adapter.

Installed with kvref; it changes nothing unless asked. With
``pytest --kvref-target=module:factory`` it also collects one test,
:mod:`kvref.conformance`'s, next to the tests pytest collects anyway. That
test is ``kvref check`` in your session: the same start-up
(:func:`kvref.check.start`: the factory's declarations, the capability
probe, the exclusions, the watchdog), the same lockstep loops, the same
verdict and floor (:mod:`kvref.verdict`) and the same summary, printed at
the end of the session. It fails on an unexplained divergence (naming its
shrunk trace) and on a run below the floor.

Options: ``--kvref-against`` (default ``spec``), ``--kvref-semantics``,
``--kvref-profile`` (kvref's settings profile ``dev``, ``ci``, ``nightly``;
default: the variable ``KVREF_PROFILE``, else ``dev``), ``--kvref-steps``
(default: the profile's step goal), ``--kvref-seed``, ``--kvref-known FILE``
(repeatable), ``--kvref-keep-going`` (list every divergence class, each with
its trace, instead of stopping at the first).

NOTE: the check runs under kvref's Hypothesis settings passed to it as a
value, and kvref pins what Hypothesis draws from only while it runs
(:func:`kvref.hypothesis_compat.pinned_constants`): your own Hypothesis tests
keep their settings, their profile (``HYPOTHESIS_PROFILE`` is yours; kvref
never reads it) and an unchanged Hypothesis. The ``kvref_target`` fixture
names the chosen target (None without ``--kvref-target``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the kit is imported when a check is asked for: a session without one stays light
    from kvref.check import CheckRequest, Session
    from kvref.verdict import Verdict

REQUEST = pytest.StashKey["CheckRequest"]()
"""The check the session asked for (set at configuration)."""
SUMMARY = pytest.StashKey[list[str]]()
"""The summary lines of the check that ran (printed at the end of the session)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--kvref-*`` options."""
    group = parser.getgroup("kvref")
    group.addoption("--kvref-target", default=None, help="adapter to check: spec, impl, vllm or module:factory")
    group.addoption("--kvref-against", default="spec", help="reference adapter: spec (default) or vllm")
    group.addoption(
        "--kvref-semantics", default="", help="semantics profile, e.g. vllm-0.33.0 (default: as kvref check)"
    )
    group.addoption(
        "--kvref-profile", default=None, help="kvref settings profile: dev, ci, nightly (default: KVREF_PROFILE or dev)"
    )
    group.addoption("--kvref-steps", type=int, default=None, help="the step goal (default: the settings profile's)")
    group.addoption("--kvref-seed", type=int, default=0, help="the seed (default 0)")
    group.addoption("--kvref-known", action="append", default=[], help="a known-differences TOML file (repeatable)")
    group.addoption("--kvref-keep-going", action="store_true", help="list every divergence class instead of stopping")


def pytest_configure(config: pytest.Config) -> None:
    """With ``--kvref-target``: build the check's request (a bad option is a
    usage error of the session) and collect the conformance test too (the
    tests pytest would collect anyway stay)."""
    target = config.getoption("--kvref-target", default=None)
    if not target:
        return
    from kvref.check import CheckRequest  # noqa: PLC0415 - see the TYPE_CHECKING import
    from kvref.divergences import load_known_file  # noqa: PLC0415
    from kvref.exits import InputError  # noqa: PLC0415
    from kvref.settings import chosen  # noqa: PLC0415

    try:
        name = chosen(config.getoption("--kvref-profile"))
        known = tuple(e for path in config.getoption("--kvref-known") for e in load_known_file(Path(path)))
    except (ValueError, InputError) as exc:
        raise pytest.UsageError(f"kvref: {exc}") from None
    steps = config.getoption("--kvref-steps")
    if steps is not None and steps <= 0:
        raise pytest.UsageError(
            f"kvref: --kvref-steps must be above 0, got {steps}: a run without steps checks nothing"
        )
    config.stash[REQUEST] = CheckRequest(
        target=target, against=config.getoption("--kvref-against"), settings=name,
        seed=config.getoption("--kvref-seed"), min_steps=steps,
        semantics=config.getoption("--kvref-semantics") or None, known=known,
        keep_going=config.getoption("--kvref-keep-going"), out=Path("kvref-classes"),
    )  # fmt: skip
    config.args.append(str(Path(__file__).with_name("conformance.py")))


def run_check(config: pytest.Config) -> None:
    """Run the session's check (:mod:`kvref.conformance` calls this); fail the
    test on a divergence or a run below the floor."""
    from kvref.check import start  # noqa: PLC0415 - see the TYPE_CHECKING import
    from kvref.exits import AdapterHang, InputError  # noqa: PLC0415

    request = config.stash[REQUEST]
    try:
        session = start(request)
    except InputError as exc:
        pytest.fail(f"kvref: {exc}", pytrace=False)
    except AdapterHang as exc:
        pytest.fail(f"kvref: adapter hang: {exc}", pytrace=False)
    verdict = _run(config, session, request)
    if verdict.code:
        pytest.fail(f"kvref check: {verdict.line}", pytrace=False)


def _run(config: pytest.Config, session: Session, request: CheckRequest) -> Verdict:
    from kvref.check import run_keep_going, run_lockstep  # noqa: PLC0415 - see the TYPE_CHECKING import
    from kvref.exits import AdapterHang  # noqa: PLC0415
    from kvref.hypothesis_compat import pinned_constants  # noqa: PLC0415
    from kvref.lockstep import DivergenceClass  # noqa: PLC0415
    from kvref.settings import profile_settings  # noqa: PLC0415
    from kvref.verdict import classes_table, judge, summary  # noqa: PLC0415

    setup = session.setup
    title = f"kvref check: {session.target} vs {session.against or '(self)'}, {session.profile.name}"
    notes = [f"left out: {note}" for note in session.notes]
    if request.layer == "facade" and not setup.shapes:
        config.stash[SUMMARY] = [title, *notes]
        return judge(setup.stats, request.goal, None, [])
    failure: str | None = None
    classes: list[DivergenceClass] = []
    base = profile_settings(request.settings)
    try:
        with pinned_constants():
            if request.keep_going:
                classes = run_keep_going(setup, request.seed, request.goal, request.out, request.budget,
                                         request.max_classes, machine=session.machine, base=base)  # fmt: skip
            else:
                failure = run_lockstep(setup, request.seed, request.goal, request.budget, machine=session.machine,
                                       base=base)  # fmt: skip
    except AdapterHang as exc:
        config.stash[SUMMARY] = [*notes, *summary(setup.stats, title, setup.excluded)]
        pytest.fail(f"kvref: adapter hang: {exc}", pytrace=False)
    lines = [*notes, *summary(setup.stats, title, setup.excluded)]
    if classes or request.keep_going:
        lines += classes_table(sorted(classes, key=lambda c: c.steps_to_find))
    verdict = judge(setup.stats, request.goal, failure, classes)
    if failure is not None:
        lines.append(f"unexplained divergence: {failure}")
        if setup.stats.last_failure is not None:
            lines.append(f"replay it: kvref replay {setup.stats.last_failure} --target {session.target}")
    config.stash[SUMMARY] = [*lines, f"kvref check: {verdict.line}"]
    return verdict


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """The check's summary, as ``kvref check`` prints it."""
    lines = config.stash.get(SUMMARY, None)
    if lines is None:
        return
    terminalreporter.write_sep("=", "kvref")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.fixture
def kvref_target(request: pytest.FixtureRequest) -> str | None:
    """The adapter given with ``--kvref-target`` (None without it)."""
    value = request.config.getoption("--kvref-target", default=None)
    return None if value is None else str(value)
