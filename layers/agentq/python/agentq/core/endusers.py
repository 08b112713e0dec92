"""End users: the person a task acts for, named by the ``user`` of a submission.

A tenant (an API key's owner) is a product; a user is one of that product's people. A task, and
its whole tree, acts for at most one user: the submission names it (or the JWT a request came
with does, ``api.auth``), the task's META keeps it, children inherit it, and every record that
says who did what repeats it (events, trace, OTel spans, the ledger's breakdown).

The charset is what identity providers put in a subject and nothing that a key, a filter or a
log line would misread: 1-128 characters, the first a letter or a digit, the rest letters,
digits and ``. _ - @ + : |`` (an email address ``a.b+c@example.com``, Auth0's
``google-oauth2|1234``, a URN ``urn:x:42``, Okta's ``00u1abcd``, a UUID). No ``#`` (the table's key
separator), ``/``, ``=`` or ``,`` (query and filter syntax), whitespace or control characters.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

MAX_USER_CHARS = 128
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,127}$"
_USER = re.compile(USER_PATTERN[1:-1])  # fullmatch: `$` would let a trailing newline by
USER_RULE = "1-128 characters: a letter or digit, then letters, digits or . _ - @ + : |"

EndUser = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_USER_CHARS,
        pattern=USER_PATTERN,
        description=f"the end user the task acts for ({USER_RULE}); its children act for the same user",
    ),
]


def valid_user(value: object) -> bool:
    """Whether ``value`` is a user name as ``EndUser`` accepts it (for values that reach us
    outside a model: a token's claim, a query parameter)."""
    return isinstance(value, str) and _USER.fullmatch(value) is not None
