"""A fresh machine installs exactly what the suite was proven with.

requirements/constraints.txt pins every package of every extra (requirements/pin.py writes it,
`make upgrade-deps` moves it); every install the Makefile, the worker image and the layer builds
make goes through it. So: the environment running this suite holds exactly the pinned versions
(the suite's own proof that the pins are what it ran on), the pins cover everything any extra
can bring, the layers' files agree with them, and no install path bypasses them.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from agentq_dev import moto_version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(path: Path) -> list[Requirement]:
    """The requirements of a pip requirements file, comments and blank lines dropped."""
    lines = (raw.split("#", 1)[0].strip() for raw in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for requirement in _requirements(CONSTRAINTS):
        (spec,) = requirement.specifier
        assert spec.operator == "==", requirement
        pins[_canonical(requirement.name)] = spec.version
    return pins


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_installed_distribution_is_at_its_pinned_version() -> None:
    pins = _pins()
    installed = {_canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    installed.pop("agentq")
    unpinned = sorted(set(installed) - set(pins))
    assert unpinned == [], (
        f"installed but not pinned: {unpinned} (`make clean test` rebuilds the venv from the pins; "
        "`make upgrade-deps` if pyproject.toml gained a dependency)"
    )
    drifted = {name: (version, pins[name]) for name, version in installed.items() if version != pins[name]}
    assert drifted == {}, f"installed version != pin: {drifted}"


def test_the_pins_cover_every_requirement_of_every_extra_and_of_what_they_bring() -> None:
    """Walked through the installed distributions' metadata (markers for this interpreter), from
    agentq with every extra; the bench extra, not installed by `make test`, by name."""
    pins = _pins()
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    roots = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        roots += [Requirement(r) for r in extra if not r.startswith("agentq[")]
    missing = sorted({_canonical(r.name) for r in roots} - set(pins))
    assert missing == [], f"named in pyproject.toml but not pinned: {missing}"
    seen: set[str] = set()
    todo = [r for r in roots if r.marker is None or r.marker.evaluate()]
    while todo:
        requirement = todo.pop()
        name = _canonical(requirement.name)
        assert name in pins, f"{requirement} (needed) is not pinned"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} outside {requirement}"
        )
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # the bench extra's, when only `make test`'s install is here
        for text in distribution.requires or []:
            dependency = Requirement(text)
            extras = requirement.extras or {""}
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dependency)
    assert {"moto", "boto3", "pip", "setuptools", "pytest"} <= set(pins)


def test_the_layers_pin_exactly_the_constraints_versions() -> None:
    pins = _pins()
    for layer in ("layers/requirements.txt", "layers/otel-requirements.txt"):
        for requirement in _requirements(ROOT / layer):
            (spec,) = requirement.specifier
            assert spec.version == pins[_canonical(requirement.name)], f"{layer}: {requirement}"


def test_moto_s_pin_is_the_release_the_local_stack_s_patches_were_read_against() -> None:
    assert _pins()["moto"] == moto_version.VERIFIED_MOTO


def test_every_install_goes_through_the_constraints_file() -> None:
    """The Makefile's installs (but upgrade-deps', which moves the pins), the worker image's and
    the layer builds' (pip's arguments) all name the constraints file."""
    makefile = (ROOT / "Makefile").read_text()
    upgrade = makefile[makefile.index("\nupgrade-deps:") :].split("\n\n", 1)[0]
    installs = [line for line in makefile.splitlines() if "pip install" in line and line not in upgrade]
    assert len(installs) >= 2
    for line in installs:
        assert "-c $(CONSTRAINTS)" in line, line
    assert "$(PIP_INSTALL)" in makefile and "--build-constraint $(CONSTRAINTS)" in makefile
    assert "CONSTRAINTS := requirements/constraints.txt" in makefile
    docker = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-compile -c requirements/constraints.txt pip setuptools" in docker
    assert "pip install --no-compile -c requirements/constraints.txt --build-constraint" in docker

    from infra.build_layers import CONSTRAINTS as LAYER_CONSTRAINTS
    from infra.build_layers import pip_command

    assert LAYER_CONSTRAINTS == CONSTRAINTS
    command = pip_command(Path("target"), "arm64")
    assert command[command.index("-c") + 1] == str(CONSTRAINTS)
