"""Policy documents: ``GET /policies`` (every scope's current rules), ``PUT /policies/{scope}``
(a new version, checked first), ``GET /policies/{scope}`` (``?version=N``),
``GET /policies/{scope}/history``, ``POST /policies/test`` (rules against a sample call, nothing
run) and ``GET /policies/schema`` (the Cedar schema rules are validated against). Every read and
write is of the caller's own tenant: another tenant's rules are never seen nor touched."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.cursors import version_page
from agentq.api.errors import JSON, responses
from agentq.api.models import MAX_LISTING_PAGE
from agentq.api.models.policies import (
    PolicyDecision,
    PolicyList,
    PolicyPut,
    PolicyRuleView,
    PolicySchema,
    PolicyTest,
    PolicyView,
    PolicyWritten,
)
from agentq.api.routes.common import ApiDeps, ListingLimit, PageCursor, Router
from agentq.control.policies import put_policy, test_policy, verdict_view
from agentq.core.policies import SCHEMA, SCOPE_PATTERN, PolicyCall, PolicyDocument, Principal, TaskFacts
from agentq.core.policies.rules import describe

Scope = Annotated[str, Path(pattern=SCOPE_PATTERN, description="`tenant`, or `agent:<name>`")]
HISTORY_CURSOR = "policy_history"


def view(doc: PolicyDocument) -> PolicyView:
    return PolicyView(scope=doc.scope, version=doc.version, policies=doc.text, digest=doc.digest,
                      rules=[PolicyRuleView.model_validate(r) for r in describe(doc.text)],
                      created_at=doc.created_at, created_by=doc.created_by)  # fmt: skip


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.get("/policies", summary="Every scope's current rules", operation_id="listPolicies", tags=["policies"],
                responses=responses(200, PolicyList))  # fmt: skip
    def list_policies() -> PolicyList:
        return PolicyList(policies=[view(d) for d in store.policies.current(tenant())])

    @routes.get("/policies/schema", summary="The Cedar schema rules are validated against",
                operation_id="getPolicySchema", tags=["policies"], responses=responses(200, PolicySchema))  # fmt: skip
    def schema() -> PolicySchema:
        return PolicySchema(cedar_schema=SCHEMA)

    @routes.post(
        "/policies/test",
        summary="Evaluate rules against a sample call",
        description="What the rules (the stored ones, or those in the body in place of a scope's) would decide for "
        "a sample call; nothing runs and nothing is stored.",
        operation_id="testPolicies",
        tags=["policies"],
        responses=responses(200, PolicyDecision, 400, 404, 413, 415, 422),
    )
    def test(body: Annotated[PolicyTest, Body(description="rules and a sample call")]) -> PolicyDecision:
        c, p, h = body.call, body.principal, body.history
        verdict = test_policy(
            store,
            tenant(),
            call=PolicyCall(c.kind, tool=c.tool, args=c.args, model=c.model, mcp_server=c.mcp_server,
                            estimated_tokens=c.estimated_tokens, estimated_usd_micros=c.estimated_usd_micros),
            principal=Principal(tenant(), agent=p.agent, agent_version=p.agent_version, user=p.user, api_key=p.api_key),
            facts=TaskFacts(
                task_id="test", root_id="test", depth=0, step=1, tools=tuple((t.name, t.status) for t in h.tools),
                task_tokens=h.task_tokens, task_spend_micros=h.task_spend_micros, tree_tokens=h.tree_tokens,
                tree_spend_micros=h.tree_spend_micros, user_spend_today_micros=h.user_spend_today_micros,
            ),
            documents=body.policies,
        )  # fmt: skip
        return PolicyDecision.model_validate(verdict_view(verdict))

    @routes.put(
        "/policies/<scope>",
        summary="Write a scope's rules (a new version)",
        description="Checked in full first: a text that does not parse or validate is 422 `validation_error` naming "
        "`policies` (an unknown scope: `scope`), and nothing is stored. The same text as the current version creates "
        "nothing (200).",
        operation_id="putPolicies",
        tags=["policies"],
        responses={
            **responses(201, PolicyWritten, 400, 404, 409, 413, 415, 422, description="Created"),
            200: {"description": "Unchanged: the current version", "content": {JSON: {"model": PolicyWritten}}},
        },
    )
    def put(scope: Scope, body: Annotated[PolicyPut, Body(description="the scope's rules")]) -> Response[PolicyWritten]:
        caller = deps.caller()  # an API key (an end user's token may not write rules: api.app.USER_PATHS)
        written = put_policy(store, tenant(), scope, body.policies, by=caller.key_id or caller.user)
        answer = PolicyWritten(created=written.created, policy=view(written.document), warnings=list(written.warnings))
        return Response(status_code=201 if written.created else 200, content_type=JSON, body=answer)

    @routes.get("/policies/<scope>", summary="A scope's current rules, or one version", operation_id="getPolicies",
                tags=["policies"], responses=responses(200, PolicyView, 404, 422))  # fmt: skip
    def get(
        scope: Scope,
        version: Annotated[
            int | None, Query(ge=1, le=999_999_999, description="a version (default: the current)")
        ] = None,
    ) -> PolicyView:
        return view(store.policies.get(tenant(), scope, version))

    @routes.get(
        "/policies/<scope>/history",
        summary="A scope's versions, newest first, a page at a time",
        description="A page holds fewer than `limit` versions once they pass 2 MB as JSON (never none): follow "
        "`next_cursor`.",
        operation_id="getPolicyHistory",
        tags=["policies"],
        responses=responses(200, PolicyList, 400, 404, 422),
    )
    def history(scope: Scope, limit: ListingLimit = MAX_LISTING_PAGE, cursor: PageCursor = None) -> PolicyList:
        def views(before: int | None) -> tuple[list[PolicyView], bool]:
            found, more = store.policies.history_page(tenant(), scope, limit=limit, before=before)
            return [view(d) for d in found], more

        page, next_cursor = version_page(HISTORY_CURSOR, [scope], cursor, views)
        return PolicyList(policies=page, next_cursor=next_cursor)

    return routes
