"""Adapters in a child process: an engine that crashes or hangs is a finding, not the checker's death.

A native engine that corrupts its memory can kill the process it runs in
(a segmentation fault, an abort): run in the checker's process, it takes the
lockstep with it, and nothing is shrunk or saved. :func:`isolated` wraps a
factory so that each adapter it builds lives in a child process of its own
(forked, so it inherits the factory as it is) and every method call, attribute
read and ``check_invariants`` is a round trip over a pipe. When the child
dies, the call raises :class:`AdapterCrashed` naming the signal or exit code
and the method: the lockstep records a crash divergence with its trace,
Hypothesis shrinks it (each replay starts a fresh child), and ``kvref replay
--isolate`` replays the crash without dying. When the lockstep's watchdog
interrupts a call that hangs, the child is killed.

Values cross the pipe pickled: requests, block ids, views and events are
plain data. An exception raised in the child is rebuilt in the parent with
its class, arguments and attributes (without calling its ``__init__``), so
``isinstance`` checks on kvspec's errors and the kit's skip errors still work.

NOTE: a round trip costs tens of microseconds, a few per lockstep step; the
attributes the kit reads on every step (:data:`STATIC`) are read once.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, protocol_version
from kvspec.config import KVCacheConfig

STATIC = frozenset({"name", "runs_every_operation", "fallback", "semantics", "construction_workaround"})
"""Attributes read once, when the adapter is built: the kit reads them on every
step, and an adapter does not change them."""

_DECLARATIONS = ("supports", "unsupported", "features")
"""A factory's declared capabilities (:func:`kvref.capabilities.declare`), kept by the wrapper."""


class AdapterCrashed(Exception):
    """The adapter's process died (a signal or an exit) during a call."""


def isolated(factory: AdapterFactory) -> AdapterFactory:
    """``factory``, building each adapter in a child process of its own
    (:class:`IsolatedAdapter`); its declarations are kept."""

    def build(config: KVCacheConfig) -> KVCacheAdapter:
        adapter: KVCacheAdapter = IsolatedAdapter(factory, config)
        return adapter

    for name in _DECLARATIONS:
        if hasattr(factory, name):
            setattr(build, name, getattr(factory, name))
    build.isolated = True  # type: ignore[attr-defined]  # what kvref check and replay report
    return build


class IsolatedAdapter:
    """A proxy of an adapter that lives in a child process (see the module docstring)."""

    def __init__(self, factory: AdapterFactory, config: KVCacheConfig) -> None:
        """Fork the child, build the adapter there.

        Raises:
            Exception: What the factory raised in the child (rebuilt here).
            AdapterCrashed: The child died while building it.
        """
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(factory, config, child), daemon=True)
        self._proc.start()
        self._owner = os.getpid()
        child.close()
        self._conn: Connection = parent
        self._static: dict[str, Any] = {}
        self._methods: dict[str, Callable[..., Any]] = {}
        self._kinds: dict[str, str] = {}
        self._where = "the factory"
        info = self._receive()
        self._static.update(info["static"])
        self.protocol_version: int = info["protocol_version"]
        self.config = config

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name.startswith("_"):
            raise AttributeError(name)
        if name in self._static:
            value = self._static[name]
            if isinstance(value, _Missing):
                raise AttributeError(name)
            return value
        method = self._methods.get(name)
        if method is not None:
            return method
        kind = self._kinds.get(name)
        if kind is None:
            kind = self._kinds[name] = self._request(("kind", name), f"reading {name}")
        if kind == "missing":
            raise AttributeError(name)
        if kind == "value":
            return self._request(("get", name), f"reading {name}")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._request(("call", name, args, kwargs), name)

        self._methods[name] = call
        return call

    def close(self) -> None:
        """End the child (also when the proxy is collected; in a process forked
        since, the proxy is a copy and ends nothing)."""
        if self.__dict__.get("_owner") != os.getpid():
            return
        conn = self.__dict__.get("_conn")
        proc = self.__dict__.get("_proc")
        if conn is not None:
            conn.close()
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(1)

    def __del__(self) -> None:
        self.close()

    def _request(self, message: tuple[Any, ...], where: str) -> Any:
        self._where = where
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            raise self._crashed() from None
        return self._receive()

    def _receive(self) -> Any:
        """The child's answer to the last request (its exception raised here).

        Raises:
            AdapterCrashed: The child died.
        """
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            raise self._crashed() from None
        except BaseException:
            # The watchdog (or Ctrl-C) interrupted a call the child is still running: end it.
            self.close()
            raise
        if status == "raise":
            raise _unpack(payload)
        return payload

    def _crashed(self) -> AdapterCrashed:
        self._proc.join(2)
        code = self._proc.exitcode
        if code is not None and code < 0:
            known = -code in signal.valid_signals()
            how = f"signal {-code} ({signal.Signals(-code).name})" if known else f"signal {-code}"
        else:
            how = f"exit code {code}" if code is not None else "an unknown cause"
        name = self._static.get("name", "the adapter")
        return AdapterCrashed(f"{name}: its process died with {how} in {self._where}")


class _Missing:
    pass


_MISSING = _Missing()


def _serve(factory: AdapterFactory, config: KVCacheConfig, conn: Connection) -> None:
    """The child: build the adapter, then answer requests until the pipe closes."""
    try:
        adapter = factory(config)
        static = {name: getattr(adapter, name) for name in STATIC if hasattr(adapter, name)}
        static.update({name: _MISSING for name in STATIC if not hasattr(adapter, name)})
        conn.send(("ok", {"static": static, "protocol_version": protocol_version(adapter)}))
    except BaseException as exc:  # the factory's refusal or failure goes to the parent
        conn.send(("raise", _pack(exc)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if message[0] == "kind":
                value = getattr(adapter, message[1], _MISSING)
                answer: Any = "missing" if value is _MISSING else "method" if callable(value) else "value"
            elif message[0] == "get":
                answer = getattr(adapter, message[1])
            else:
                answer = getattr(adapter, message[1])(*message[2], **message[3])
            conn.send(("ok", answer))
        except BaseException as exc:
            conn.send(("raise", _pack(exc)))


def _pack(exc: BaseException) -> tuple[type, tuple[Any, ...], dict[str, Any]] | str:
    """An exception as its class, arguments and attributes (a string when they do not pickle)."""
    state = {k: v for k, v in vars(exc).items() if not k.startswith("__")}
    packed = (type(exc), exc.args, state)
    try:
        pickle.dumps(packed)
    except Exception:
        return f"{type(exc).__name__}: {exc}"
    return packed


def _unpack(payload: tuple[type, tuple[Any, ...], dict[str, Any]] | str) -> BaseException:
    if isinstance(payload, str):
        return RuntimeError(f"the adapter's process raised {payload}")
    cls, args, state = payload
    exc: BaseException = BaseException.__new__(cls)
    exc.args = args
    vars(exc).update(state)
    return exc
