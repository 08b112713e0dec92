"""Write the project's pins from an environment the suite runs in: requirements/constraints.txt
(every package of every extra, pip and setuptools included) and the Lambda layers' own files.

Why: ``pyproject.toml`` states ranges (what agentq works with); a fresh install resolved inside
them gets whatever was released last, so a fresh clone once ran the suite on a moto release it
had never been proven with, and failed. ``make`` installs from the constraints file instead
(``pip install -c``, and ``--build-constraint`` for setuptools in the editable build), and the
layers are built with it (``infra/build_layers.py``), so a fresh machine gets exactly what the
suite was proven with. ``make upgrade-deps`` is the one way the pins move: it resolves every
extra afresh in a new venv, runs this script against it, then runs the whole suite on the result.

    python requirements/pin.py --python .venv-upgrade/bin/python

The layers' files (``layers/requirements.txt``, ``layers/otel-requirements.txt``) keep their
package lists and comments; only each pin's version is set to the constraints file's
(``tests/test_dependency_pins.py`` checks they agree).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
LAYER_FILES = (ROOT / "layers" / "requirements.txt", ROOT / "layers" / "otel-requirements.txt")
HEADER = """\
# Every package `make` installs, at the version the suite was proven with: written by
# `make upgrade-deps` (requirements/pin.py) from a venv holding every extra. Do not edit by hand.
# pip install -c requirements/constraints.txt --build-constraint requirements/constraints.txt -e ".[dev]"
"""
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[^\]]*\])?==(?P<version>\S+)(?P<rest>.*)$")


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def frozen(python: str) -> dict[str, str]:
    """``name==version`` of every distribution in ``python``'s environment but the editable agentq."""
    out = subprocess.run(
        [python, "-m", "pip", "freeze", "--all", "--exclude-editable", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pins: dict[str, str] = {}
    for line in out.splitlines():
        match = _PIN.match(line.strip())
        if match is None:
            raise SystemExit(f"pin.py: not a name==version line in pip freeze: {line!r}")
        pins[match["name"]] = match["version"]
    return pins


def repin(text: str, pins: dict[str, str], source: Path) -> str:
    """``text`` (a requirements file) with every ``name==version`` set to ``pins``' version."""
    lines = []
    for line in text.splitlines():
        match = _PIN.match(line)
        if match is None:
            lines.append(line)
            continue
        version = pins.get(canonical(match["name"]))
        if version is None:
            raise SystemExit(f"pin.py: {source} pins {match['name']}, which the environment does not have")
        lines.append(f"{match['name']}{match['extras'] or ''}=={version}{match['rest']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the environment to pin")
    args = parser.parse_args(argv)
    pins = frozen(args.python)
    body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=canonical))
    by_canonical = {canonical(name): version for name, version in pins.items()}
    layers = {
        layer: repin(layer.read_text(), by_canonical, layer) for layer in LAYER_FILES
    }  # may refuse: before any write
    for layer, text in layers.items():
        layer.write_text(text)
    CONSTRAINTS.write_text(HEADER + body)
    print(f"pinned {len(pins)} packages in {CONSTRAINTS.relative_to(ROOT)}; layers repinned", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
