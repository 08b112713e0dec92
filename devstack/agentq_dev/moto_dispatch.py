"""The handler methods of a response class are listed once per class, not on every request.

Why: for every request of every service, moto's ``BaseResponse.call_action`` checks that the
action is a method of the handler class with ``method_names_from_class(self.__class__)``:
``inspect.getmembers`` over the class (every attribute of it and its bases, each looked up,
tested and sorted) to answer one ``in``. ~3 % of the server's CPU per DynamoDB call under
``bench/moto_throughput.py`` (py-spy), and as much per SQS and S3 call. The answer depends on
the class only, and the local server's handler classes do not change while it serves (every
patch of this package is installed before the first request).

Here each class's method names are worked out with moto's own function the first time a
request of that class asks, and kept as a frozenset (``call_action`` only asks ``in``).

Which moto: ``moto_version.VERIFIED_MOTO`` (read in 5.2.5, and again in 5.2.6): ``call_action``
calls the name ``method_names_from_class`` of ``moto.core.responses``, its only caller.
``install`` patches nothing on another version.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentq_dev import moto_version


@moto_version.verified_patch
def install() -> None:
    """Patch moto's response dispatch in this process (idempotent). False on a moto version not
    verified."""
    responses = importlib.import_module("moto.core.responses")
    listed = responses.method_names_from_class
    names: dict[type, frozenset[str]] = {}

    def method_names_from_class(clazz: Any) -> frozenset[str]:
        known = names.get(clazz)
        if known is None:
            known = names[clazz] = frozenset(listed(clazz))
        return known

    method_names_from_class.__wrapped__ = listed  # type: ignore[attr-defined]  # moto's, for the tests
    responses.method_names_from_class = method_names_from_class  # type: ignore[attr-defined]  # imported there, not exported
