"""The lazily re-exported names (``agentq``, ``agentq.observe``) are declared three times: the
``_EXPORTS`` table the PEP 562 hook resolves at run time, the literal ``__all__`` linters and
type checkers read, and the ``TYPE_CHECKING`` imports that give each name its type. These tests
keep the three in step, so a name added to one and not the others fails here, not in a user's
``from agentq import X``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

import agentq
from agentq import observe


def _type_checking_imports(module: ModuleType) -> set[str]:
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in stmt.names)
    return names


@pytest.mark.parametrize("module", [agentq, observe], ids=lambda m: m.__name__)
def test_all_lists_exactly_the_lazy_exports(module: ModuleType) -> None:
    assert module.__all__ == sorted(module._EXPORTS)


@pytest.mark.parametrize("module", [agentq, observe], ids=lambda m: m.__name__)
def test_every_export_is_typed_and_resolves_to_its_modules_object(module: ModuleType) -> None:
    submodules = set(getattr(module, "_SUBMODULES", ()))
    assert _type_checking_imports(module) == set(module._EXPORTS) | submodules
    for name, where in module._EXPORTS.items():
        source = importlib.import_module(where if "." in where else f"{module.__name__}.{where}")
        assert getattr(module, name) is getattr(source, name), name


def test_the_package_version_is_pyproject_s() -> None:
    """``agentq.__version__`` (the MCP server's ``server_info.version``) is the one release number."""
    import importlib.metadata
    import tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    assert agentq.__version__ == tomllib.loads(pyproject.read_text())["project"]["version"]
    assert agentq.__version__ == importlib.metadata.version("agentq")
