"""End users: the person a task acts for, named by the ``user`` of a submission.

A tenant (an API key's owner) is a product; a user is one of that product's people. A task, and
its whole tree, acts for at most one user: the submission names it (or the JWT a request came
with does, ``api.auth``), the task's META keeps it, children inherit it, and every record that
says who did what repeats it (events, trace, OTel spans, the ledger's breakdown).

The charset is what identity providers put in a subject and nothing that a key, a filter or a
log line would misread (no pydantic here: the authorizer Lambda imports this module): 1-128 characters, the first a letter or a digit, the rest letters,
digits and ``. _ - @ + : |`` (an email address ``a.b+c@example.com``, Auth0's
``google-oauth2|1234``, a URN ``urn:x:42``, Okta's ``00u1abcd``, a UUID). No ``#`` (the table's key
separator), ``/``, ``=`` or ``,`` (query and filter syntax), whitespace or control characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from agentq.core.errors import AgentqError

MAX_USER_CHARS = 128
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,127}$"
_USER = re.compile(USER_PATTERN[1:-1])  # fullmatch: `$` would let a trailing newline by
USER_RULE = "1-128 characters: a letter or digit, then letters, digits or . _ - @ + : |"


def valid_user(value: object) -> bool:
    """Whether ``value`` is a user name as a submission's ``user`` accepts it (for values that reach us
    outside a model: a token's claim, a query parameter)."""
    return isinstance(value, str) and _USER.fullmatch(value) is not None


class UserNotAllowed(AgentqError):
    """A caller naming a user it may not act for (403, naming ``user``)."""

    code = "user_not_allowed"


# Who may decide a held call (an approval): ``tenant``, only the tenant's API keys (its operator:
# the console, the CLI with a key, its backend); ``user``, the task's own end user's token too.
Approver = Literal["tenant", "user"]
APPROVERS: tuple[Approver, ...] = ("tenant", "user")


class UserMayNot(AgentqError):
    """What a caller acting as one end user (a token's) may not send, where it depends on more
    than the request (an agent's resolved defaults): 403 ``forbidden`` naming the field, as the
    API's own refusals of a token's fields (``api.user_submission``)."""

    code = "forbidden"


class NotTheApprover(AgentqError):
    """An end user's token deciding a held call only its tenant decides (403; nothing changes).
    Such an ask (a policy rule's, by default; an ``ask_tenant`` tool's; a cap's soft threshold)
    is the operator's check on what the user's task does: the user it is for would approve it
    for themself, so they may neither approve nor reject it."""

    code = "not_the_approver"

    def __init__(self, task_id: str, use_id: str, user: str) -> None:
        super().__init__(
            f"task {task_id}: the call it holds ({use_id}) is its tenant's to decide (approver: tenant); the token of "
            f"end user {user!r} may not approve or reject it: an API key of the tenant may (POST /tasks/{task_id}/"
            "approve or /reject, agentq approve|reject, the console). Nothing was changed",
            field="task_id",
        )


@dataclass(frozen=True)
class Caller:
    """Who a request acts for, as the authorizer established it.

    ``user`` set: a JWT's user (``api.oidc``); the request acts as that user, may name no other,
    and sees only that user's tasks of its tenant. ``user`` None: an API key, acting for the
    whole tenant; it may name a user only if the key was created allowed to (``names_users``,
    ``agentq keys create --act-for-users``)."""

    tenant: str
    user: str | None = None
    names_users: bool = False
    operator: bool = False
    key_id: str | None = None  # the key a request came with: its tasks carry it (agentq stop --key, caps)

    @property
    def bound(self) -> bool:
        """Acting as one user (a JWT's), not for the whole tenant."""
        return self.user is not None

    def acting_user(self, named: str | None) -> str | None:
        """The user a request that names ``named`` (or none) acts for, or ``UserNotAllowed``."""
        if self.user is not None:
            if named is not None and named != self.user:
                raise UserNotAllowed(
                    f"user: this token acts for {self.user!r}; it may not name another user", field="user"
                )
            return self.user
        if named is not None and not self.names_users:
            raise UserNotAllowed(
                "user: this API key may not name an end user; create one that may (agentq keys create "
                "--act-for-users) or authenticate the user with a token of the deployment's OIDC issuer",
                field="user",
            )
        return named

    def reads_for(self, named: str | None, reading: str) -> str | None:
        """The end user a read that names ``named`` (or none) is narrowed to: a key reads the
        one it names, or its whole tenant's; a token reads its own user's only, with or without
        naming it, and naming another is ``UserNotAllowed`` (``reading``: what it reads, for
        the message)."""
        if self.user is None:
            return named
        if named not in (None, self.user):
            raise UserNotAllowed(f"user: this token reads {reading} of {self.user!r} only", field="user")
        return self.user

    def sees(self, tenant: str, user: str | None) -> bool:
        """Whether a task of ``tenant`` acting for ``user`` is visible to this caller."""
        return tenant == self.tenant and (self.user is None or user == self.user)
