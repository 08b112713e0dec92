"""An import-linter contract type: no circle of imports among a package's modules.

import-linter's own ``acyclic_siblings`` contract looks for circles between sibling *packages*,
each counted with everything under it, which is a stricter rule than this one: it refuses
``queueing`` and ``storage`` each importing some module of the other even where no module
imports itself back. This contract looks at modules: a module may not import itself through
any chain of others (``a -> b -> a``), whatever package each is in.

It reads the graph import-linter builds (grimp), so it sees what grimp sees: every ``import``
and ``from ... import`` statement in the source, at module level, inside a function or a class,
and under ``if TYPE_CHECKING:`` (the graph is built with ``exclude_type_checking_imports``
false, import-linter's default); an ``import a.b.c`` counts as importing ``a.b.c`` only. It does
not see imports by name at run time (``importlib.import_module``, the package root's lazy
``__getattr__`` map), nor a package's ``__init__`` run before its submodule.

Each module that lies on a circle is reported with the shortest circle through it, as a chain
with the line of each import, so every module of every circle appears in at least one chain.
Used from pyproject.toml (``contract_types``); ``make lint`` and ``make layers`` run it with the
other contracts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Set
from itertools import pairwise
from typing import cast

from grimp import DetailedImport, ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.imports import Module

Chain = tuple[str, ...]  # a circle, first module repeated at the end: ("a", "b", "a")


def shortest_cycle_through(start: str, imports: Mapping[str, Set[str]]) -> Chain | None:
    """The shortest chain of imports from ``start`` back to itself, or None (breadth first,
    neighbours in name order, so the same graph gives the same chain)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        module = queue.popleft()
        for imported in sorted(imports.get(module, ())):
            if imported == start:
                path = [module]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return (*reversed(path), start)
            if imported not in seen:
                seen.add(imported)
                parent[imported] = module
                queue.append(imported)
    return None


def find_cycles(imports: Mapping[str, Set[str]]) -> list[Chain]:
    """Every distinct shortest circle through a module of ``imports`` (module -> the modules it
    imports), each rotated to start at its first module by name, shortest first."""
    found: set[Chain] = set()
    for module in imports:
        chain = shortest_cycle_through(module, imports)
        if chain is not None:
            ring = chain[:-1]
            first = ring.index(min(ring))
            rotated = ring[first:] + ring[:first]
            found.add((*rotated, rotated[0]))
    return sorted(found, key=lambda chain: (len(chain), chain))


class AcyclicModulesContract(Contract):
    """``containers``: the packages whose modules (the package itself and all below it) may
    form no circle of imports among themselves."""

    type_name = "acyclic_modules"

    containers = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        modules: set[str] = set()
        # On an instance a field holds its parsed value (import-linter's Contract sets it).
        for container in cast(list[Module], self.containers):
            modules |= {container.name, *graph.find_descendants(container.name)}
        imports = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
        cycles = find_cycles(imports)
        links = [
            [(importer, imported, _lines(graph, importer, imported)) for importer, imported in pairwise(chain)]
            for chain in cycles
        ]
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles, "links": links})

    def render_broken_contract(self, check: ContractCheck) -> None:
        cycles: list[Chain] = check.metadata["cycles"]
        links: list[list[tuple[str, str, str]]] = check.metadata["links"]
        output.print_error(f"{len(cycles)} import circle(s), the shortest through each module on one:")
        output.new_line()
        for chain, steps in zip(cycles, links, strict=True):
            output.print_error(" -> ".join(chain))
            for importer, imported, where in steps:
                output.indent_cursor()
                output.print(f"{importer} -> {imported} ({where})")
            output.new_line()


def _lines(graph: ImportGraph, importer: str, imported: str) -> str:
    details: list[DetailedImport] = graph.get_import_details(importer=importer, imported=imported)
    return ", ".join(f"l.{d['line_number']}: {d['line_contents']}" for d in details)
