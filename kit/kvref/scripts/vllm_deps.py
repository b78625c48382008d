"""Install the light dependencies of the installed vLLM release, read from its own metadata.

Run by ``install-vllm.sh`` with the target environment's interpreter, after
the CPU torch and vLLM itself (``--no-deps``) are installed there:

    python vllm_deps.py [--extra REQ ...]

kvref drives only vLLM's KV-cache bookkeeping, so it needs the pure-Python
(or CPU-only) packages of vLLM's import path, never a GPU build. The list is
not kept by hand per release: it is the release's own ``Requires-Dist``
(markers evaluated for this interpreter, no extras) with three rules, the
*known exclusions*:

1. :data:`EXCLUDED` names are left out: torch and its family (the CPU build is
   already installed and pinned), Triton, CUDA and NVIDIA packages, GPU kernel
   libraries and other heavy runtimes the KV-cache core never imports;
2. :data:`WITHOUT_DEPS` names (a package the import path needs that declares a
   GPU-only dependency, such as xgrammar's Triton) are installed with
   ``--no-deps``, at the newest version within vLLM's requirement whose own
   requirements this environment meets (Triton and torch aside), installing
   the ones that are missing;
3. every install is dry-run first with torch pinned to the installed build; a
   requirement whose resolution would bring in a forbidden package
   (:data:`FORBIDDEN`) is left out with a one-line notice naming what it
   pulls, and the rest is installed. A left-out package the import path needs
   shows in the import check that follows.

Exit status: 0 installed, 1 refused or failed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, requires, version

try:
    from packaging import markers, requirements
    from packaging import version as versions
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging import markers, requirements  # type: ignore[no-redef]  # the same API
    from pip._vendor.packaging import version as versions  # type: ignore[no-redef]  # the same API

Requirement = requirements.Requirement
Version = versions.Version

FORBIDDEN = re.compile(r"^(torch|triton|torchvision|torchaudio|nvidia-.*|cuda-.*|cupy.*)$")
"""Packages no install may bring in (torch is the installed CPU build, pinned)."""

EXCLUDED = re.compile(
    r"^(torch|torchvision|torchaudio|torchcodec|triton|xformers|nvidia-.*|cuda-.*|cupy.*"
    r"|flashinfer(-.*)?|tilelang|quack-kernels|humming-kernels|tokenspeed-mla|pynvvideocodec|nvtx"
    r"|fastsafetensors|instanttensor|deep-gemm|deep-ep|zentorch|ray|b12x|helion|tensorizer)$"
)
"""Requirements left out on purpose (normalized names): the torch family and
GPU runtimes, GPU kernel libraries, and Ray (a cluster runtime the KV-cache
core never imports, 0.16.0 requires it)."""

WITHOUT_DEPS = re.compile(r"^(xgrammar)$")
"""Requirements installed with ``--no-deps`` (they declare Triton on Linux)."""

EXTRA = ("xxhash",)
"""Also installed: vLLM's xxhash block-hash functions import it, and no
release lists it."""


def main() -> int:
    """Plan, dry-run and install; see the module docstring."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--extra", action="append", default=[], help="another requirement to install")
    args = parser.parse_args()
    wanted, no_deps = plan()
    wanted += [Requirement(r) for r in (*EXTRA, *args.extra)]
    log(f"from vLLM {version('vllm')}'s metadata: {len(wanted)} requirements, {len(no_deps)} without dependencies")
    kept = drop_forbidden(wanted)
    if kept:
        pip("install", *map(str, kept))
    for req in no_deps:
        install_without_deps(req)
    return 0


def plan() -> tuple[list[Requirement], list[Requirement]]:
    """vLLM's applicable requirements, minus :data:`EXCLUDED`, split into
    those installed with their dependencies and those without."""
    env = environment()
    wanted: list[Requirement] = []
    no_deps: list[Requirement] = []
    for line in requires("vllm") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = normalize(req.name)
        if EXCLUDED.match(name):
            continue
        req.marker = None
        (no_deps if WITHOUT_DEPS.match(name) else wanted).append(req)
    return wanted, no_deps


def drop_forbidden(reqs: list[Requirement]) -> list[Requirement]:
    """``reqs`` without the ones whose resolution brings in a forbidden
    package (each left out with a notice); raises SystemExit if the rest
    does not resolve."""
    kept = list(reqs)
    for _ in range(len(reqs) + 1):
        report = dry_run(kept)
        if report is None:
            culprits = [r for r in kept if dry_run([r]) is None]
            if not culprits:
                raise SystemExit("install-vllm: the requirements do not resolve together (see pip's output above)")
            for r in culprits:
                log(f"left out {r}: it does not resolve with the installed CPU torch")
            kept = [r for r in kept if r not in culprits]
            continue
        bad = forbidden_pulls(report, kept)
        if not bad:
            return kept
        for text, pulled in bad.items():
            log(f"left out {text}: it would bring in {', '.join(sorted(pulled))}")
        kept = [r for r in kept if str(r) not in bad]
    raise SystemExit("install-vllm: could not find an installable set of requirements")


def dry_run(reqs: list[Requirement]) -> dict[str, object] | None:
    """pip's installation report for ``reqs`` (None when they do not resolve)."""
    if not reqs:
        return {"install": []}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--no-input", "install", "--dry-run", "--quiet", "--report", "-",
         *map(str, reqs)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        return None
    report: dict[str, object] = json.loads(out.stdout)
    return report


def forbidden_pulls(report: dict[str, object], reqs: list[Requirement]) -> dict[str, set[str]]:
    """Each requirement of ``reqs`` whose dependency closure (in the report)
    holds a forbidden package, with those packages."""
    env = environment()
    items = report.get("install", [])
    assert isinstance(items, list)
    deps: dict[str, set[str]] = {}
    for item in items:
        meta = item["metadata"]
        edges = set()
        for line in meta.get("requires_dist") or []:
            dep = Requirement(line)
            extras = item.get("requested_extras") or []
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in ["", *extras]):
                edges.add(normalize(dep.name))
        deps[normalize(meta["name"])] = edges
    bad: dict[str, set[str]] = {}
    for req in reqs:
        seen, stack = set(), [normalize(req.name)]
        while stack:
            name = stack.pop()
            if name in seen or name not in deps:
                continue
            seen.add(name)
            stack.extend(deps[name])
        pulled = {n for n in seen if FORBIDDEN.match(n)}
        if pulled:
            bad[str(req)] = pulled
    return bad


def install_without_deps(req: Requirement) -> None:
    """Install ``req`` with ``--no-deps`` at the newest version whose own
    requirements (torch and Triton aside) this environment meets, installing
    the missing ones; raises SystemExit if no version fits."""
    name = normalize(req.name)
    candidates = sorted((v for v in available_versions(name) if req.specifier.contains(v, prereleases=False)),
                        key=Version, reverse=True)  # fmt: skip
    for candidate in candidates:
        needs = requirements_of(name, candidate)
        if needs is None:
            continue
        missing, clash = [], []
        for dep in needs:
            have = installed_version(dep.name)
            if have is None:
                missing.append(dep)
            elif not dep.specifier.contains(have, prereleases=True):
                clash.append(f"{dep.name} {have} (needs {dep.specifier})")
        if clash:
            log(f"{name} {candidate} skipped: {'; '.join(clash)}")
            continue
        if missing:
            kept = drop_forbidden(missing)
            if len(kept) != len(missing):
                continue
            pip("install", *map(str, kept))
        pip("install", "--no-deps", f"{name}=={candidate}")
        return
    raise SystemExit(f"install-vllm: no version of {req} fits this environment (see above)")


def available_versions(name: str) -> list[str]:
    """The versions of ``name`` the index offers (``pip index versions``)."""
    out = subprocess.run([sys.executable, "-m", "pip", "--no-input", "index", "versions", name],
                         capture_output=True, text=True, check=False)  # fmt: skip
    match = re.search(r"Available versions: (.*)", out.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def requirements_of(name: str, candidate: str) -> list[Requirement] | None:
    """``name==candidate``'s applicable requirements without torch and Triton
    (from a dry run's report), or None if pip cannot read them."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--no-input", "install", "--dry-run", "--no-deps", "--quiet",
         "--ignore-installed", "--report", "-", f"{name}=={candidate}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        return None
    env = environment()
    reqs = []
    for item in json.loads(out.stdout).get("install", []):
        for line in item["metadata"].get("requires_dist") or []:
            dep = Requirement(line)
            if dep.marker is not None and not dep.marker.evaluate(env):
                continue
            if not FORBIDDEN.match(normalize(dep.name)):
                dep.marker = None
                reqs.append(dep)
    return reqs


def environment() -> dict[str, str]:
    """The marker environment of this interpreter, with no extra requested."""
    env: dict[str, str] = {k: str(v) for k, v in markers.default_environment().items()}
    env["extra"] = ""
    return env


def installed_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(*args: str) -> None:
    log("pip " + " ".join(args))
    subprocess.run([sys.executable, "-m", "pip", "--no-input", *args], check=True)


def log(message: str) -> None:
    print(f"install-vllm: {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
