"""How ``make test`` (``-n 6 --dist loadgroup``) schedules the suite over xdist's workers:
which tests run together on one worker (the groups), and which are handed out first (the
longest), loaded by tests/conftest.py.

Why an order: xdist hands a worker its next test in collection order (after the groups, which
it hands out first, largest first). In file order the run ended with a stretch of 10-17 s
tests (tests/test_worker_liveness.py, test_worker_kill.py, test_zombie_worker.py) that kept
one or two workers busy ~35 s after the others had run out of tests, the cores half idle. The
tests ``tests/durations.json`` lists as long (measured by ``make durations``) go first, longest
first, so the run ends on short tests that fill in evenly. A test missing from the file (new,
or under a second) keeps its place after them; a stale file costs balance, never a result.

And why the controller rewrites the test modules' asserts before it starts the workers: pytest
caches each rewritten test module in ``__pycache__``, but on a fresh clone six workers start at
once, all miss that cache and each rewrites every test module (~5 CPU-s a worker, on two cores).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
DURATIONS = TESTS_DIR / "durations.json"
STORED_FROM = 1.0  # seconds: shorter tests are not worth an entry

# Session-scoped fixtures that start processes: each is the name of the xdist group of the
# tests that use it (see pytest_collection_modifyitems), and ends with its group's last test
# (see pytest_runtest_teardown).
SESSION_GROUPS = frozenset({"api_stack"})
# ... each split by module into this many groups, balanced by the modules' durations: one group
# is one worker's tests one after another, and ``api_stack``'s (some 400 tests, ~450 s under
# make test) as one group were the run's longest path, as long as the run (issue 41). Each
# shard starts a stack of its own (~25 CPU-s over a run) and fills a table of its own.
SESSION_SHARDS = {"api_stack": 2}
UNLISTED = 0.3  # seconds: what a test missing from durations.json is taken to take (all under STORED_FROM)
# Fixtures whose tests are one group of the given name, as if marked ``xdist_group``: every test
# of the CDK's synths (tests/test_cdk_stack.py's, which any module may import) is in ``cdk``.
FIXTURE_GROUPS = {"synth_root": "cdk"}


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """pytest 9 keeps an item's node id structured (``_id``); before, a string (``_nodeid``)."""
    if hasattr(item, "_id"):
        item._id = type(item._id).parse(nodeid)
    else:
        setattr(item, "_nodeid", nodeid)  # noqa: B010 (an attribute of older pytest versions)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Ready the suite for ``-n 6 --dist loadgroup`` (the Makefile's ``make test``).

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
    grouped too, whatever their module, in ``SESSION_SHARDS`` groups of whole modules: spread
    over every worker they started a stack in each, idling for the rest of the run (~20 CPU-s
    apiece); as one group they were the run's longest path.

    A test marked ``@pytest.mark.xdist_group("name")`` (xdist's own mark, which xdist 3.8 writes
    where pytest 9 does not read it) is in that group whatever its fixtures, as is a test that
    uses a fixture of ``FIXTURE_GROUPS``: ``cdk`` holds every test that starts the CDK's jsii
    runtime (tests/test_cdk_stack.py says why), those of the shared synths by their fixture."""
    grouping = bool(getattr(config.option, "loadgroup", False))  # set in xdist's workers
    durations = _durations() if grouping else {}
    seconds: dict[str, float] = {}  # node id -> how long the test is expected to take, if on its own
    sharded: dict[str, list[pytest.Item]] = {}  # a session group's tests, split below
    for item in items:
        parent, _, last = item.nodeid.rpartition("::")
        if parent and last != item.name:
            _set_nodeid(item, f"{parent}::{item.name}")
        info = getattr(item, "_fixtureinfo", None)
        if not grouping or info is None:
            continue
        used = set(getattr(item, "fixturenames", ()))  # every fixture it needs, those of its fixtures too
        marked = item.get_closest_marker("xdist_group")
        named = [FIXTURE_GROUPS[name] for name in sorted(used & FIXTURE_GROUPS.keys())]
        if marked is not None or named:
            group = (marked.args[0] if marked.args else marked.kwargs["name"]) if marked is not None else named[0]
            _set_nodeid(item, f"{item.nodeid}@{group}")
            continue
        if used & SESSION_GROUPS:
            name = min(used & SESSION_GROUPS)
            sharded.setdefault(name, []).append(item)
            continue
        shared = any(
            defs and defs[-1].scope == "module" for name, defs in info.name2fixturedefs.items() if name in used
        )
        if shared:
            _set_nodeid(item, f"{item.nodeid}@{item.nodeid.split('::', 1)[0]}")
        else:
            seconds[item.nodeid] = durations.get(item.nodeid, 0.0)
    for name, grouped in sharded.items():
        for item, shard in _shards(grouped, SESSION_SHARDS.get(name, 1), durations):
            _set_nodeid(item, f"{item.nodeid}@{name}.{shard}")
    # Longest first among the tests scheduled on their own; a group's tests keep their order
    # (sharing a module-scoped fixture, pytest has put those of one parameter together).
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A session group's fixture ends after the group's last test, not with the worker's run:
    the group is handed to one worker whole, which runs its tests one after another, so once
    the next test does not use the fixture, no test on this worker will. (``api_stack``, a
    local stack of three processes, idled ~220 s a run that way, ~10 CPU-s.) Should a test
    want it again all the same, pytest sets it up again, as for a fixture never set up."""
    if nextitem is None or not getattr(item.config.option, "loadgroup", False):
        return  # the end of the run tears it down anyway; without groups, no such order
    info = getattr(item, "_fixtureinfo", None)
    ending = SESSION_GROUPS & set(getattr(item, "fixturenames", ())) - set(getattr(nextitem, "fixturenames", ()))
    for name in sorted(ending):
        for fixturedef in info.name2fixturedefs.get(name, ()) if info is not None else ():
            if fixturedef.scope == "session":
                fixturedef.finish(item._request)  # type: ignore[attr-defined]


def _shards(items: list[pytest.Item], count: int, durations: dict[str, float]) -> list[tuple[pytest.Item, int]]:
    """Each item's shard (0 .. count-1): whole modules, the longest first to the shard with the
    least so far. The same in every worker, which each work it out from the same collection and
    durations.json (xdist requires every worker to collect the same node ids)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    expected = {m: sum(durations.get(i.nodeid, UNLISTED) for i in its) for m, its in modules.items()}
    load = [0.0] * count
    shard_of: dict[str, int] = {}
    for module in sorted(modules, key=lambda m: (-expected[m], m)):
        shard_of[module] = load.index(min(load))
        load[shard_of[module]] += expected[module]
    return [(item, shard_of[module]) for module, its in modules.items() for item in its]


def _durations() -> dict[str, float]:
    try:
        loaded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def _without_group(nodeid: str) -> str:
    base, at, group = nodeid.rpartition("@")
    return base if at and (group.partition(".")[0] in SESSION_GROUPS or group.startswith("tests/")) else nodeid


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write how long each test took (setup, call and teardown; those of {STORED_FROM:g} s or more) "
        f"to {DURATIONS.name}, the order make test hands tests out in (make durations)",
    )


_took: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """(In xdist's controller, every worker's reports arrive here.)"""
    _took[_without_group(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return
    # Merged into what the file had: a run of some tests (-k, -x, a module) updates those only.
    measured = {nodeid: round(took, 1) for nodeid, took in _took.items()}
    kept = {nodeid: took for nodeid, took in {**_durations(), **measured}.items() if took >= STORED_FROM}
    DURATIONS.write_text(json.dumps(dict(sorted(kept.items())), indent=0) + "\n")


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's has started the fork server, which warms meanwhile
def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        _rewrite_test_modules(config)


def _rewrite_test_modules(config: pytest.Config) -> None:
    """Fill pytest's cache of rewritten test modules (what each worker's import of a test module
    would otherwise write, if no other worker has yet). pytest has no public call for it: on a
    pytest whose internals differ this does nothing, and the workers rewrite as before."""
    if sys.dont_write_bytecode:
        return
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
    except (ImportError, AttributeError, KeyError):
        return
    for path in sorted(TESTS_DIR.rglob("*.py")):
        if not (path.name.startswith("test_") or path.name == "conftest.py"):
            continue
        try:
            cache = rewrite.get_cache_dir(path)
            if not rewrite.try_makedirs(cache):
                return
            pyc = cache / (path.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(path, pyc, state.trace) is None:
                source_hash, code = rewrite._rewrite_test(path, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
        except Exception:
            continue
