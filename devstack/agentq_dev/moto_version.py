"""The one moto release whose internals the local stack's patches were read against.

Why: the local server patches moto's internals (``moto_rollback``, ``moto_query``, ``moto_speed``,
``moto_updates``, ``moto_conditions``, ``moto_sizes``, ``moto_dispatch``, ``moto_sqs``,
``moto_streams``, ``moto_models``): private functions, attributes and data layouts that a patch
release may change without notice. moto 5.2.6 did: it changed how an item's numbers are sized,
and a guard that accepted the whole 5.2 series let it through, so the suite went red on a fresh
clone while CI, with an older install, stayed green. Hence an exact version, not a series:

- every patch declines (``verified_patch``) on any other version, so a patch written for one
  layout never runs against another;
- the local server refuses to start on any other version (``require_verified``, called by
  ``moto_server.MotoServer.start`` and ``moto_app.main``), with a message naming both versions
  and the way out, instead of running unpatched and behaving differently (slower, growing
  without bound, sizing items another way) without a word;
- the version installed is the one ``requirements/constraints.txt`` pins, which ``make`` installs
  from, so a fresh machine gets it. ``make upgrade-deps`` moves the pins; a new moto then stops
  here until its internals are read again against each patch module's "Which moto" paragraph and
  this constant is moved.

``AGENTQ_UNVERIFIED_MOTO=1`` lets a developer reading a new release start the server with every
patch declined (moto's own code, as it ships) to compare; nothing in the project sets it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

VERIFIED_MOTO = "5.2.6"  # == the pin in requirements/constraints.txt (tests/test_dependency_pins.py)
ESCAPE_HATCH = "AGENTQ_UNVERIFIED_MOTO"


class UnverifiedMoto(RuntimeError):
    """The installed moto is not the release the local stack's patches were read against."""


def installed() -> str:
    """The installed moto's version string."""
    import moto

    return str(moto.__version__)


def verified() -> bool:
    return installed() == VERIFIED_MOTO


def require_verified() -> None:
    """Raise ``UnverifiedMoto`` with a message a user can act on, unless the installed moto is
    the verified one (or the developer's escape hatch is set)."""
    if verified() or os.environ.get(ESCAPE_HATCH) == "1":
        return
    raise UnverifiedMoto(
        f"moto {installed()} is installed, but agentq's local stack was verified against moto {VERIFIED_MOTO} "
        "only (it patches moto's internals). Install the pinned versions: "
        "`pip install -c requirements/constraints.txt -e '.[local]'` (or `make clean demo`). "
        f"To try another moto unpatched, set {ESCAPE_HATCH}=1."
    )


def verified_patch(patch: Callable[[], None]) -> Callable[[], bool]:
    """``install()`` for a patch of moto's internals: runs ``patch`` at most once a process, and
    only on ``VERIFIED_MOTO`` (any other version is left as it is, since the patch was checked
    against that release's internals only). Returns whether the patch is in place."""
    installed_here = False

    @functools.wraps(patch, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def install() -> bool:
        nonlocal installed_here
        if not installed_here and verified():
            patch()
            installed_here = True
        return installed_here

    return install
