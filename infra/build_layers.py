"""Build the third-party dependencies Lambda layer without Docker.

``pip install --target`` with ``--platform manylinux2014_<arch> --only-binary=:all:`` downloads
the wheels Lambda's Python 3.12 runtime needs, whatever machine this runs on. The result is
cached under ``.venv/agentq-layers/deps-<arch>-<hash>/`` (``AGENTQ_LAYER_CACHE`` overrides the
root), keyed by a hash of ``layers/requirements.txt``, ``requirements/constraints.txt`` (which pins
what those depend on) and the target platform, so a synth
builds once and later synths (and ``make test``) reuse it.

Offline: if pip cannot download and no cached build exists, ``build_deps_layer`` returns an
empty placeholder (``built=False`` and pip's error). The stack refuses to synthesize with a
placeholder unless it is told the synth is a test (``agentq:allow-unbuilt-deps-layer``), so
nothing empty is ever deployed.

Command line (what ``cdk synth`` does on its own; useful to warm the cache or see errors)::

    .venv/bin/python infra/build_layers.py [--architecture arm64|x86_64] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: concurrent builders each build, the rename keeps one
    fcntl = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "layers" / "requirements.txt"
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"  # every transitive dependency's pin (requirements/pin.py)
CORE_LAYER_DIR = ROOT / "layers" / "agentq"  # contains python/agentq: the layer as is
PYTHON_VERSION = "3.12"  # the Lambda runtime the layers are built for (infra.stack uses PYTHON_3_12)
PLATFORMS = {"arm64": "manylinux2014_aarch64", "x86_64": "manylinux2014_x86_64"}
# The Lambda runtime ships boto3/botocore/s3transfer; a copy in the layer would shadow the
# runtime's botocore under the runtime's boto3 (version skew). aws-xray-sdk drags botocore in.
PRUNE = ("boto3", "botocore", "s3transfer", "bin")
# The EC2 workspace tier's boto3 (an instance has no runtime that brings it), pinned by the constraints.
BOTO_REQUIREMENTS = ROOT / "layers" / "boto-requirements.txt"
COMPLETE_MARKER = ".agentq-layer-complete"


@dataclass(frozen=True)
class DepsLayer:
    path: Path  # the layer asset directory (holds python/...)
    built: bool  # False: an empty placeholder because pip could not build it
    message: str  # what happened, for the test report or the synth error


def cache_root() -> Path:
    override = os.environ.get("AGENTQ_LAYER_CACHE")
    return Path(override) if override else ROOT / ".venv" / "agentq-layers"


def cache_key(
    architecture: str,
    python_version: str = PYTHON_VERSION,
    requirements: Path = REQUIREMENTS,
    prune: tuple[str, ...] = PRUNE,
) -> str:
    digest = hashlib.sha256()
    digest.update(requirements.read_bytes())
    digest.update(CONSTRAINTS.read_bytes())
    digest.update(f"{PLATFORMS[architecture]}|cp{python_version}|{','.join(prune)}".encode())
    suffix = "" if python_version == PYTHON_VERSION else f"-py{python_version}"
    return f"deps-{architecture}{suffix}-{digest.hexdigest()[:16]}"


def pip_command(
    target: Path,
    architecture: str,
    python_version: str = PYTHON_VERSION,
    requirements: Path = REQUIREMENTS,
    constraints: Path | None = CONSTRAINTS,
) -> list[str]:
    """pip installing ``requirements`` for the Lambda platform; with ``constraints`` (our layers:
    every transitive dependency at the version the suite was proven with), or without (your
    tools' layer, whose own pins ours must not overrule)."""
    pinned = ["-c", str(constraints)] if constraints is not None else []
    return [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--target", str(target),
        "--platform", PLATFORMS[architecture],
        "--implementation", "cp",
        "--python-version", python_version,
        "--only-binary=:all:",
        "-r", str(requirements),
        *pinned,
    ]  # fmt: skip


def build_deps_layer(
    architecture: str = "arm64",
    *,
    python_version: str = PYTHON_VERSION,
    force: bool = False,
    timeout: float = 300,
    requirements: Path = REQUIREMENTS,
    prune: tuple[str, ...] = PRUNE,
) -> DepsLayer:
    """The dependencies layer directory for ``architecture``, built if not cached.
    (``python_version`` other than the runtime's is for tests that import the layer here;
    ``requirements`` another pinned file, for a layer only some stacks add; ``prune`` what to
    leave out: boto3 and botocore for Lambda, which has them, nothing for the EC2 tier's boto3.)"""
    if architecture not in PLATFORMS:
        raise ValueError(f"architecture must be one of {', '.join(PLATFORMS)}, not {architecture!r}")
    root = cache_root()
    final = root / cache_key(architecture, python_version, requirements, prune)
    if (final / COMPLETE_MARKER).exists() and not force:
        return DepsLayer(final, True, f"cached at {final}")
    with _one_builder(root, final.name):
        if (final / COMPLETE_MARKER).exists() and not force:  # built while this one waited
            return DepsLayer(final, True, f"cached at {final}")
        return _build_deps_layer(final, architecture, python_version, requirements, force, timeout, prune)


def _build_deps_layer(
    final: Path,
    architecture: str,
    python_version: str,
    requirements: Path,
    force: bool,
    timeout: float,
    prune: tuple[str, ...] = PRUNE,
) -> DepsLayer:
    root = final.parent
    # Build beside the cache and rename into place: nothing ever sees a half-built directory,
    # and a builder without the lock (no fcntl) that loses the rename drops its copy.
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    failure = _pip(pip_command(work / "python", architecture, python_version, requirements), timeout)
    if failure is not None:
        shutil.rmtree(work, ignore_errors=True)
        return _placeholder(root, architecture, f"pip could not build the dependencies layer ({failure})")
    for name in os.listdir(work / "python"):
        base = name.split("-")[0] if name.endswith(".dist-info") else name
        if base.lower() in prune:
            shutil.rmtree(work / "python" / name, ignore_errors=True)
    (work / COMPLETE_MARKER).write_text(
        " ".join(pip_command(Path("python"), architecture, python_version, requirements)) + "\n"
    )
    if force and final.exists():
        shutil.rmtree(final, ignore_errors=True)
    try:
        work.rename(final)
    except OSError:  # another builder got there first; theirs is identical
        shutil.rmtree(work, ignore_errors=True)
    return DepsLayer(final, True, f"built into {final}")


def build_user_layer(
    package_dir: Path, requirements: Path | None, architecture: str = "arm64", *, timeout: float = 300
) -> DepsLayer:
    """Your tools as a layer: the contents of ``package_dir`` on the layer's Python path, plus
    ``requirements`` installed as for the dependencies layer (manylinux wheels, no Docker).
    Cached under a hash of every file and the requirements, so an unchanged package is not
    rebuilt; ``built=False`` (a placeholder) when pip cannot install the requirements."""
    if not package_dir.is_dir():
        raise ValueError(f"user_code.package_dir: {package_dir} is not a folder")
    digest = hashlib.sha256(f"{PLATFORMS[architecture]}|cp{PYTHON_VERSION}".encode())
    sources = sorted(p for p in package_dir.rglob("*") if p.is_file() and not _skipped(p.relative_to(package_dir)))
    for path in sources:
        digest.update(str(path.relative_to(package_dir)).encode() + b"\0" + path.read_bytes())
    if requirements is not None:
        digest.update(requirements.read_bytes())
    root = cache_root()
    final = root / f"user-{architecture}-{digest.hexdigest()[:16]}"
    if (final / COMPLETE_MARKER).exists():
        return DepsLayer(final, True, f"cached at {final}")
    with _one_builder(root, final.name):
        if (final / COMPLETE_MARKER).exists():
            return DepsLayer(final, True, f"cached at {final}")
        return _build_user_layer(final, package_dir, sources, requirements, architecture, timeout)


def _build_user_layer(
    final: Path, package_dir: Path, sources: list[Path], requirements: Path | None, architecture: str, timeout: float
) -> DepsLayer:
    root = final.parent
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    target = work / "python"
    target.mkdir()
    if requirements is not None:
        failure = _pip(pip_command(target, architecture, requirements=requirements, constraints=None), timeout)
        if failure is not None:
            shutil.rmtree(work, ignore_errors=True)
            return _placeholder(root, f"user-{architecture}", f"pip could not install {requirements.name} ({failure})")
    for path in sources:
        dest = target / path.relative_to(package_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    (work / COMPLETE_MARKER).write_text(f"{package_dir} + {requirements}\n")
    try:
        work.rename(final)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
    return DepsLayer(final, True, f"built into {final}")


@contextlib.contextmanager
def _one_builder(root: Path, name: str) -> Iterator[None]:
    """Builders of one layer take turns (pytest-xdist workers, two synths at once): the second
    finds the first's build complete rather than running pip for the same layer again."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _pip(command: list[str], timeout: float) -> str | None:
    """Run pip; None when it succeeded, else the last line of what it said."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln]
    return lines[-1] if lines else f"pip exited {proc.returncode}"


def _skipped(path: Path) -> bool:
    return (
        "__pycache__" in path.parts
        or path.suffix in (".pyc", ".pyo")
        or any(part.startswith(".") for part in path.parts)
    )


def _placeholder(root: Path, architecture: str, message: str) -> DepsLayer:
    path = root / f"unbuilt-{architecture}"
    (path / "python").mkdir(parents=True, exist_ok=True)
    (path / "python" / "README.txt").write_text(
        "Placeholder: the agentq dependencies layer could not be built here (no network?).\n"
        "Run `.venv/bin/python infra/build_layers.py` where PyPI is reachable.\n"
    )
    return DepsLayer(path, False, message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", choices=sorted(PLATFORMS), default="arm64")
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    args = parser.parse_args(argv)
    layer = build_deps_layer(args.architecture, force=args.force)
    print(layer.message if layer.built else f"error: {layer.message}", file=sys.stdout if layer.built else sys.stderr)
    if layer.built:
        print(layer.path)
    return 0 if layer.built else 1


if __name__ == "__main__":
    sys.exit(main())
