"""Where a deployment's own tools come from: tool modules, named or installed.

A tool module is any importable module (or package) with ``@tool`` functions
(``agentq.core.tools.tool``), and ``@grader`` functions an outcome may name (``agentq.core.grading``). Its tools are its ``TOOLS`` list when it has one (the order the
model sees them), else every ``@tool`` function defined at its top level. A process finds
tool modules in two places, both of them, in this order:

1. ``AGENTQ_TOOL_MODULES``: comma-separated module names (what ``agentq dev``, ``agentq
   worker`` and ``agentq run`` pass on with ``--tools``, and what CDK sets on the functions);
2. the ``agentq.tools`` entry-point group of every installed distribution, so ``pip install
   my-tools`` is enough: ``[project.entry-points."agentq.tools"] my_tools = "my_tools.tools"``.

Every process of a deployment (the API, which checks a submission's tool names, and the
workers, which run them) must load the same modules; both read the same variable and the same
installed packages. A module that cannot be imported is a configuration error naming it, not
a traceback: nothing starts with half its tools.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types
from collections.abc import Iterable

from agentq.control.defaults import ConfigurationError
from agentq.core.graders import GraderSpec
from agentq.core.tools import ToolSpec

ENTRY_POINT_GROUP = "agentq.tools"
VARIABLE = "AGENTQ_TOOL_MODULES"


def installed_tool_modules() -> list[str]:
    """The module names the installed distributions declare in the ``agentq.tools`` group."""
    return sorted({ep.value.split(":", 1)[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def tools_of(module: types.ModuleType) -> list[ToolSpec]:
    """A module's ``TOOLS``, else its top-level ``@tool`` functions in definition order."""
    listed = getattr(module, "TOOLS", None)
    if listed is not None:
        specs = list(listed)
        bad = [repr(s) for s in specs if not isinstance(s, ToolSpec)]
        if bad:
            raise ConfigurationError(
                f"tool module {module.__name__!r}: TOOLS holds {', '.join(bad)[:200]}, not @tool functions",
                field=VARIABLE,
            )
        return specs
    return [value for value in vars(module).values() if isinstance(value, ToolSpec)]


def graders_of(module: types.ModuleType) -> list[GraderSpec]:
    """A module's top-level ``@grader`` functions (``core.grading``), which an outcome may name."""
    return [value for value in vars(module).values() if isinstance(value, GraderSpec)]


def load_tool_modules(names: Iterable[str]) -> list[ToolSpec]:
    """The tools of each named module, then of each installed one (each module once)."""
    return load_modules(names)[0]


def load_modules(names: Iterable[str]) -> tuple[list[ToolSpec], list[GraderSpec]]:
    """The tools and the graders of each named module, then of each installed one (each module once)."""
    specs: list[ToolSpec] = []
    graders: list[GraderSpec] = []
    seen: set[str] = set()
    for given in [*names, *installed_tool_modules()]:
        name = given.strip()
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # ImportError, or the module's own code failing (a bad @tool signature)
            raise ConfigurationError(
                f"tool module {name!r} cannot be imported: {type(exc).__name__}: {exc}"[:600], field=VARIABLE
            ) from None
        specs += tools_of(module)
        graders += graders_of(module)
    return specs, graders
