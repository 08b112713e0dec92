"""How ``make test`` (``-n 6 --dist loadgroup``) schedules the suite over xdist's workers:
which tests run together on one worker (the groups), loaded by tests/conftest.py."""

from __future__ import annotations

import pytest

# Session-scoped fixtures that start processes: each is the name of the xdist group of the
# tests that use it (see pytest_collection_modifyitems).
SESSION_GROUPS = frozenset({"api_stack"})


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """pytest 9 keeps an item's node id structured (``_id``); before, a string (``_nodeid``)."""
    if hasattr(item, "_id"):
        item._id = type(item._id).parse(nodeid)
    else:
        setattr(item, "_nodeid", nodeid)  # noqa: B010 (an attribute of older pytest versions)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Ready the suite for ``-n 4 --dist loadgroup`` (the Makefile's ``make test``).

    Every test gets a node id of its own: schemathesis names each generated test of
    tests/test_api_schema.py after its operation (``...[GET /tasks]``) but gives all of them
    the function's node id, and xdist's group scheduling keys tests by node id, so all but
    one would silently not run.

    A module whose tests share a module-scoped fixture (a local stack, a browser, a synth)
    is one xdist group: its tests run on one worker, so the fixture is set up once a run,
    not once per worker (or once per stretch of the module a worker happens to get). Every
    other test is scheduled on its own, as with xdist's default distribution. The group is
    written into the node id here (``...@tests/test_x.py``, how xdist's scheduler reads it)
    rather than left to an ``xdist_group`` mark: xdist 3.8 writes it where pytest 9 no
    longer reads a node id, which would make every group silently one test each.

    The tests of ``api_stack`` (a session-scoped local stack: moto, the API, two workers) are
    one group too, whatever their module: spread over four workers they started four such
    stacks, each idling in its worker for the rest of the run (~20 CPU-s apiece), for tests
    that need one."""
    grouping = bool(getattr(config.option, "loadgroup", False))  # set in xdist's workers
    for item in items:
        parent, _, last = item.nodeid.rpartition("::")
        if parent and last != item.name:
            _set_nodeid(item, f"{parent}::{item.name}")
        info = getattr(item, "_fixtureinfo", None)
        if not grouping or info is None:
            continue
        used = set(getattr(item, "fixturenames", ()))
        if used & SESSION_GROUPS:
            _set_nodeid(item, f"{item.nodeid}@{min(used & SESSION_GROUPS)}")
            continue
        shared = any(
            defs and defs[-1].scope == "module" for name, defs in info.name2fixturedefs.items() if name in used
        )
        if shared:
            _set_nodeid(item, f"{item.nodeid}@{item.nodeid.split('::', 1)[0]}")
