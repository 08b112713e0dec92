"""No module of the package is a warehouse: each stays under 500 lines (issue 41's bound), so
a newcomer can read one whole. A module that grows past it is split by responsibility, the
way ``core/tools/_context.py`` left ``core/tools/_core.py``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (ROOT / "layers" / "agentq" / "python" / "agentq", ROOT / "devstack" / "agentq_dev", ROOT / "infra")
MAX_LINES = 500


def test_no_module_of_the_package_the_dev_stack_or_the_cdk_app_is_over_500_lines() -> None:
    over = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in package.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert over == {}
