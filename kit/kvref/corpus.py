"""The trace corpus that ships with kvref.

The repository keeps its traces in ``traces/`` at the top (language-neutral
files any port can read); the wheel carries the same folder inside the
package, as ``kvref/traces``. :func:`root` finds whichever is there, so
``kvref replay --corpus vllm-0.25.1/golden`` works from an installed wheel
and from a source checkout alike.

Folders are named ``vllm-<release>/<kind>`` (``golden``, ``divergences``,
``directed``); ``traces/README.md`` describes each one.
"""

from __future__ import annotations

from pathlib import Path

from kvref.exits import InputError

_PACKAGED = Path(__file__).resolve().parent / "traces"
_CHECKOUT = Path(__file__).resolve().parents[2] / "traces"


def root() -> Path:
    """The corpus folder: the packaged copy in a wheel, else the checkout's ``traces/``.

    Raises:
        InputError: When neither exists (a broken install).
    """
    for candidate in (_PACKAGED, _CHECKOUT):
        if (candidate / "schema").is_dir():
            return candidate
    raise InputError(f"no trace corpus found (looked in {_PACKAGED} and {_CHECKOUT})")


def folders() -> list[str]:
    """Every corpus folder that holds traces, e.g. ``"vllm-0.25.1/golden"``, sorted."""
    base = root()
    return sorted({p.parent.relative_to(base).as_posix() for p in base.glob("vllm-*/*/*.jsonl")})


def files(selector: str) -> list[Path]:
    """The traces of ``selector``: a folder (``"vllm-0.25.1/golden"``) or a
    whole profile (``"vllm-0.25.1"``, every folder of that profile).

    Raises:
        InputError: For a selector that names no corpus folder (the known ones listed).
    """
    base = root()
    chosen = [f for f in folders() if f == selector or f.startswith(selector.rstrip("/") + "/")]
    if not chosen:
        raise InputError(f"--corpus {selector!r}: no such corpus folder; known: {', '.join(folders())}")
    return [p for f in chosen for p in sorted((base / f).glob("*.jsonl"))]
