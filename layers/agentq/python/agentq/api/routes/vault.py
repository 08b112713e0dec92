"""The vault (``core.vault``, docs/VAULTS.md): put, list and delete credentials. Nothing here
answers with a secret: a put answers with what a listing shows.

Who may name which user is the API's rule (``core.endusers.Caller``): an end user's token acts
for that user only (another user named is 403 naming ``user``); an API key names the user it
writes for only if it was created allowed to (``--act-for-users``), and otherwise reaches the
tenant's own credentials only.
Another tenant's credentials are never reachable: every key of the vault starts with the
caller's tenant."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.errors import responses
from agentq.api.models.vault import CredentialList
from agentq.api.routes.common import ApiDeps, Router
from agentq.control import vault
from agentq.core.endusers import MAX_USER_CHARS, USER_PATTERN
from agentq.core.vault import NAME_PATTERN, NAME_RULE, CredentialInfo, CredentialWrite

TAGS = ["vault"]
Name = Annotated[str, Path(pattern=NAME_PATTERN, description=f"the credential's name ({NAME_RULE})")]
User = Annotated[
    str | None,
    Query(max_length=MAX_USER_CHARS, pattern=USER_PATTERN, description="the end user; none: the tenant's own"),
]


def router(deps: ApiDeps, cipher: Any = None) -> Router:
    routes = Router()
    tenant = deps.tenant

    def acting_user(named: str | None) -> str | None:
        """The user the request acts for (``core.endusers.Caller``): a token's own (another
        named is 403 naming ``user``), or the one a key allowed to name users names."""
        return deps.caller().acting_user(named)

    @routes.put(
        "/vault/credentials/<name>",
        summary="Write a credential (its value is never readable back)",
        description="Stored encrypted, bound to its hosts; a task of its user (or, without user, any task of the "
        "tenant) uses it by reference. Tasks paused waiting for it resume.",
        operation_id="putCredential",
        tags=TAGS,
        responses=responses(200, CredentialInfo, 400, 403, 404, 413, 415, 422, 503),
    )
    def put(name: Name, body: Annotated[CredentialWrite, Body()]) -> CredentialInfo:
        user = acting_user(body.user)
        write = body if user == body.user else body.model_copy(update={"user": user})
        return vault.put(deps.store, deps.queues, cipher, tenant(), name, write)

    @routes.get("/vault/credentials", summary="List credentials: names, hosts and dates only",
                operation_id="listCredentials", tags=TAGS, responses=responses(200, CredentialList, 403, 422))  # fmt: skip
    def list_credentials(user: User = None) -> CredentialList:
        who = acting_user(user)
        return CredentialList(user=who, credentials=vault.listing(deps.store, tenant(), who))

    @routes.delete("/vault/credentials/<name>", summary="Delete a credential", operation_id="deleteCredential",
                   tags=TAGS, responses=responses(200, CredentialInfo, 403, 404, 422))  # fmt: skip
    def delete(name: Name, user: User = None) -> CredentialInfo:
        return vault.delete(deps.store, tenant(), acting_user(user), name)

    return routes
