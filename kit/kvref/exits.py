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
