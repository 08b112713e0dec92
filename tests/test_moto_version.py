"""The local stack runs only on the moto release its patches were read against.

The patches of moto's internals (devstack/agentq_dev/moto_*.py) are verified against one release,
``moto_version.VERIFIED_MOTO``, which is the one ``requirements/constraints.txt`` pins. On any
other release every patch declines (leaves moto exactly as it ships) and the server refuses to
start with a message naming both versions, rather than running differently without a word. The
other version is faked in a fresh interpreter (a patch installs once a process), and "every
patch" is every ``install`` in the package's ``moto_*`` modules, found by listing them, so a
patch module added later is covered without editing this test.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import moto

import agentq_dev
from agentq_dev import moto_version

# Patches of something other than moto's internals: the standard library's header parser.
NOT_MOTO = {"moto_http"}

FAKE_VERSION = "5.2.7"

PROBE = r"""
import importlib, json, sys, types
import moto
moto.__version__ = sys.argv[1]
names = json.loads(sys.argv[2])

def moto_state():
    # every module-level attribute and every class attribute of every moto module imported, by identity
    state = {}
    for name, module in list(sys.modules.items()):
        if not (name == "moto" or name.startswith("moto.")) or not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(vars(module).items()):
            state[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    state[f"{name}.{attr}.{member}"] = id(inner)
    return state

modules = [importlib.import_module(f"agentq_dev.{n}") for n in names]
importlib.import_module("agentq_dev.moto_app")  # what the server imports, moto's backends included
for m in ("moto.dynamodb.models", "moto.sqs.models", "moto.core.responses", "moto.core.serialize"):
    importlib.import_module(m)
before = moto_state()
installed = {m.__name__: m.install() for m in modules}
after = moto_state()
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
from agentq_dev import moto_server, moto_version
refused = None
if not moto_version.verified():  # on the verified release this would start a server
    try:
        moto_server.MotoServer().start(timeout=5).stop()
    except moto_version.UnverifiedMoto as error:
        refused = str(error)
print(json.dumps({"installed": installed, "changed": changed, "refused": refused}))
"""


def _patch_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(agentq_dev.__path__) if m.name.startswith("moto_")]
    return sorted(n for n in names if n not in NOT_MOTO)


def _probe(version: str, *, env: dict[str, str] | None = None) -> dict[str, object]:
    patches = [n for n in _patch_modules() if n not in ("moto_app", "moto_server", "moto_version")]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, version, json.dumps(patches)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    probed: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return probed


def test_the_installed_moto_is_the_release_the_patches_were_read_against() -> None:
    """A fresh install from the project's pins gets the verified release. When this fails, moto
    was upgraded: read each patch module's "Which moto" paragraph against the new release, then
    move ``VERIFIED_MOTO`` (and the pin, with `make upgrade-deps`)."""
    assert moto.__version__ == moto_version.VERIFIED_MOTO
    assert moto_version.verified()
    moto_version.require_verified()  # does not raise


def test_every_patch_module_installs_through_the_version_guard() -> None:
    """Each ``moto_*`` module with an ``install`` (but the header parser's) is a ``verified_patch``."""
    import importlib

    for name in _patch_modules():
        module = importlib.import_module(f"agentq_dev.{name}")
        install = getattr(module, "install", None)
        if install is None:
            continue
        assert install.__code__ is moto_version.verified_patch(lambda: None).__code__, name


def test_on_another_moto_every_patch_declines_and_the_server_refuses_to_start_naming_both_versions() -> None:
    probed = _probe(FAKE_VERSION)
    installed = probed["installed"]
    assert isinstance(installed, dict) and len(installed) >= 10
    assert not any(installed.values()), installed
    assert probed["changed"] == []
    refused = probed["refused"]
    assert isinstance(refused, str)
    assert f"moto {FAKE_VERSION} is installed" in refused
    assert f"verified against moto {moto_version.VERIFIED_MOTO}" in refused
    assert "requirements/constraints.txt" in refused and moto_version.ESCAPE_HATCH in refused


def test_on_the_verified_moto_the_same_probe_sees_every_patch_installed_and_moto_changed() -> None:
    """The probe above can fail: on the verified release the same calls patch moto."""
    probed = _probe(moto_version.VERIFIED_MOTO)
    installed = probed["installed"]
    assert isinstance(installed, dict) and all(installed.values()), installed
    assert probed["changed"] != []


def test_the_server_program_exits_with_the_message_on_another_moto() -> None:
    """``python -m agentq_dev.moto_app`` (what the stack runs) stops at start-up, exit code 2."""
    code = (
        "import sys, moto; moto.__version__ = sys.argv[1]\nfrom agentq_dev import moto_app; moto_app.main(['-p', '1'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, FAKE_VERSION], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert f"moto {FAKE_VERSION} is installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_agentq_demo_and_dev_stop_with_the_message_and_exit_code_2_on_another_moto() -> None:
    code = (
        "import sys, moto; moto.__version__ = sys.argv[1]\n"
        "from agentq.cli.main import main; sys.exit(main([sys.argv[2]]))"
    )
    for command in ("demo", "dev"):
        result = subprocess.run(
            [sys.executable, "-c", code, FAKE_VERSION, command], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 2, (command, result.stderr)
        assert result.stderr.startswith(f"agentq: moto {FAKE_VERSION} is installed"), (command, result.stderr)
        assert "Traceback" not in result.stderr
