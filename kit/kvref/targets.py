"""``module:name`` paths: how ``--target``, ``--known`` matchers and lineage
manager classes name a callable of the user's code.

A module is looked up on ``sys.path`` and then in the working folder (as
``python -m`` would), so ``--target mymod:make`` works without setting
``PYTHONPATH``. Whatever goes wrong while importing it (a missing module, a
syntax error, an exception its top level raises, a ``sys.exit`` there) is an
:class:`kvref.exits.InputError` of one line naming the path and the cause,
never a traceback.

NOTE: a module of its own, below :mod:`kvref.adapters` and
:mod:`kvref.divergences`, which both resolve such paths: when it lived in
the first, the two imported each other.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from kvref.exits import InputError


def load_callable(path: str, what: str) -> Any:
    """The callable named ``module:attribute``.

    Raises:
        InputError: Naming ``what`` when the path is malformed, the module
            cannot be imported (missing, a syntax error, an exception or an
            exit at its top level) or the attribute is not callable.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{what}: {path!r} is not module:name")
    module = import_module(module_name, what)
    found = getattr(module, attr, None)
    if not callable(found):
        raise InputError(f"{what}: module {module_name!r} has no callable {attr!r}")
    return found


def import_module(module_name: str, what: str) -> ModuleType:
    """Import ``module_name`` (found as the module docstring says).

    Raises:
        InputError: One line naming ``what`` and why the import failed.
    """
    try:
        return _import(module_name)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise InputError(f"{what}: cannot import {module_name!r}: syntax error at {where}: {exc.msg}") from None
    except ImportError as exc:
        raise InputError(f"{what}: cannot import {module_name!r}: {exc}") from None
    except SystemExit as exc:
        raise InputError(f"{what}: importing {module_name!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise InputError(f"{what}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module_name.partition(".")[0] or cwd in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)
