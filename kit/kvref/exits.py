"""Exit codes of the ``kvref`` command, input errors and the adapter watchdog.

=====  ============================================================================
code   meaning
=====  ============================================================================
0      everything checked agreed (or was explained by a registered divergence)
1      an unexplained divergence (a trace was written), or a replay did not go as
       the trace expects
2      bad usage or input: an option, a trace file, a target, a configuration
3      nothing was checked: no lockstep step, no trace step, no engine ran
4      an adapter operation exceeded the watchdog (``--op-timeout``)
130    interrupted (Ctrl-C); the summary so far and any trace written are printed
=====  ============================================================================

When several apply, the first of 2, 4, 1, 3 in that order wins.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

OK = 0
DIVERGENCE = 1
USAGE = 2
NOTHING_CHECKED = 3
HANG = 4
INTERRUPTED = 130

DEFAULT_OP_TIMEOUT = 120.0
"""Seconds one adapter operation may take before the watchdog fires."""


class InputError(ValueError):
    """A bad input, described in one line: the file (and line) and the broken condition."""


class AdapterHang(BaseException):
    """An adapter operation ran past the watchdog.

    Derives from ``BaseException`` so that no ``except Exception`` in an
    adapter or in Hypothesis swallows it, and Hypothesis does not try to
    shrink a history whose every replay would hang again.
    """


_INTERRUPTED = threading.Event()
"""Set by :func:`interruptible`'s SIGINT handler; cleared when a command starts."""


@contextmanager
def interruptible() -> Iterator[None]:
    """Make Ctrl-C stick for the body: the first SIGINT raises
    ``KeyboardInterrupt`` and is remembered, so that an interrupt Python
    swallows (one raised inside a finaliser or a weakref callback is only
    printed) is raised again at the next adapter operation
    (:func:`raise_if_interrupted`, called by :func:`watchdog`).

    Only in the main thread, where signal handlers can be set, and not when
    the process started with SIGINT ignored (as background jobs of a
    non-interactive shell do)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        _INTERRUPTED.set()
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield  # started with Ctrl-C ignored (a background job): keep it so
        return
    previous_hook = sys.unraisablehook

    def quiet_interrupts(unraisable: Any) -> None:
        # A swallowed interrupt is re-raised by raise_if_interrupted; Python's
        # report of it ("Exception ignored in ...", a traceback) is noise.
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous_hook(unraisable)

    _INTERRUPTED.clear()
    previous = signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = quiet_interrupts
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous)
        _INTERRUPTED.clear()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived since the command started."""
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


@contextmanager
def watchdog(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`AdapterHang` in the calling thread if the body takes
    longer than ``seconds`` (None or 0: no limit; only in the main thread,
    where POSIX interval timers deliver their signal). An interrupt that was
    swallowed earlier is raised here first (:func:`interruptible`)."""
    raise_if_interrupted()
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        raise AdapterHang(f"{what} did not return within {seconds:g} s (watchdog, --op-timeout)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Watchdog:
    """:func:`watchdog` for a series of calls: the signal handler is installed
    once for the series and each call only re-arms the timer.

    NOTE: the lockstep runs every operation on every adapter under the
    watchdog; installing and restoring the handler around each adapter call
    was 3% of a ci run (cProfile), re-arming the timer is one system call.
    """

    def __init__(self, seconds: float | None) -> None:
        """A watchdog of ``seconds`` per call (None or 0: none; only in the main thread)."""
        usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        self.seconds = seconds if seconds and usable else None
        self.what = ""
        self._previous: Any = None

    def __enter__(self) -> Watchdog:
        if self.seconds is not None:
            self._previous = signal.signal(signal.SIGALRM, self._fire)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)

    def arm(self, what: str) -> None:
        """Start the clock for one call named ``what`` (an interrupt swallowed earlier is raised first)."""
        raise_if_interrupted()
        self.what = what
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def disarm(self) -> None:
        """Stop the clock (the call returned)."""
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _fire(self, signum: int, frame: FrameType | None) -> None:
        raise AdapterHang(f"{self.what} did not return within {self.seconds:g} s (watchdog, --op-timeout)")
