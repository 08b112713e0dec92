"""Operator commands that use the deployment's table and queues directly (its AGENTQ_* and
AWS_* settings, not the HTTP API): API keys, tenants' running limits, the dead-letter queues,
purging finished tasks."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentq.cli.args import add_command


def _cmd_keys(args: argparse.Namespace) -> int:
    from agentq.runtime import Settings, client
    from agentq.storage.api_keys import KeyStore
    from agentq.storage.dynamodb import DynamoTable

    settings = Settings.from_env()
    keys = KeyStore(DynamoTable(client(settings, "dynamodb", pool=2), settings.table))
    if args.keys_command == "create":
        token, record = keys.create(args.tenant, operator=args.operator, act_for_users=args.act_for_users)
        if args.json:
            print(
                json.dumps(
                    {
                        "api_key": token,
                        "key_id": record.key_id,
                        "tenant": record.tenant,
                        "operator": record.operator,
                        "act_for_users": record.act_for_users,
                        "created_at": record.created_at,
                    }
                )
            )
        else:
            print(token)
            role = "operator key" if record.operator else "key"
            print(f"{role} {record.key_id} for tenant {record.tenant!r}: store it now, it cannot be shown again "
                  f"(revoke with: agentq keys revoke {record.key_id})", file=sys.stderr)  # fmt: skip
        return 0
    if args.keys_command == "revoke":
        record = keys.revoke(args.key_id)
        print(
            f"revoked {record.key_id} (tenant {record.tenant!r}); API Gateway may accept it until its authorizer cache expires"
        )
        return 0
    rows = keys.list(args.tenant)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "key_id": k.key_id,
                        "tenant": k.tenant,
                        "operator": k.operator,
                        "created_at": k.created_at,
                        "revoked": k.revoked,
                    }
                    for k in rows
                ]
            )
        )
        return 0
    for k in rows:
        from agentq.cli.views import when

        state = "revoked " + when(k.revoked_at) if k.revoked else "active"
        print(f"{k.key_id}  {when(k.created_at)}  {state}{'  operator' if k.operator else ''}")
    if not rows:
        print(f"no keys for tenant {args.tenant!r}", file=sys.stderr)
    return 0


def _cmd_tenants(args: argparse.Namespace) -> int:
    from agentq.control.tenants import set_max_running, set_weight
    from agentq.runtime import Settings, build_queues, build_store

    settings = Settings.from_env()
    store = build_store(settings, pool=4)
    store.slots = settings.defaults.running_slots(store)
    if args.tenants_command == "limit":
        if args.max_running is None and not args.clear and args.weight is None and not args.clear_weight:
            print("agentq: tenants limit needs --max-running N, --clear, --weight N or --clear-weight", file=sys.stderr)
            return 2
        if args.max_running is not None or args.clear:
            limit = None if args.clear else args.max_running
            usage = set_max_running(store, args.tenant, limit, build_queues(settings), weight=args.weight,
                                    clear_weight=args.clear_weight)  # fmt: skip
        else:
            usage = set_weight(store, args.tenant, args.weight)
        rows = [usage]
    elif args.tenants:
        rows = [store.slots.usage(t) for t in args.tenants]
    else:  # the operator's view, as GET /usage/tenants and the console show it
        rows = store.slots.all_usage()
    if args.json:
        print(json.dumps([r.__dict__ for r in rows]))
        return 0
    for r in rows:
        limit = "unlimited" if r.limit is None else str(r.limit)
        print(f"{r.tenant}  running {r.running}  waiting {r.waiting}  max_running {limit}  weight {r.weight}")
    if not rows:
        print("no tenant holds running slots or has a limit of its own", file=sys.stderr)
    return 0


# Where limits are set, what ARCHITECTURE §12 says of a limit as large as the fleet: the weighted
# wake passes over a tenant at its hard limit, so its own releases wake its own waiters.
FULL_FLEET_NOTE = (
    "A limit equal to the fleet's capacity (AGENTQ_FLEET_CAPACITY) or above lets this tenant hold the whole "
    "fleet, and then each slot one of its tasks frees goes to its own waiting tasks, ahead of other tenants "
    "waiting for the fleet (their weights do not help them); keep it below the capacity to leave the others room."
)


def _cmd_dlq(args: argparse.Namespace) -> int:
    from agentq.queueing.dlq import list_dead_letters, redrive
    from agentq.runtime import Settings, build_queues, build_store

    settings = Settings.from_env()
    queues = build_queues(settings)
    if args.dlq_command == "list":
        letters = list_dead_letters(queues, build_store(settings), tier=args.tier, limit=args.limit)
        if args.json:
            print(json.dumps([letter.__dict__ for letter in letters]))
            return 0
        if not letters:
            print("no messages in the dead-letter queues")
        for d in letters:
            print(f"{d.tier:<7} {d.task_id or '-':<34} {d.task_status or '-':<10} {d.reason}")
        return 0
    reports = redrive(queues, tier=args.tier)
    for r in reports:
        moved = "moving asynchronously" if r.moved is None else f"{r.moved} message(s)"
        print(f"{r.tier:<7} {moved} back to the {r.tier} queue ({r.method})")
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    from agentq.control.retention import TASK_PK_PREFIX, purge_task
    from agentq.runtime import Settings, build_store

    store = build_store(Settings.from_env(), pool=4)
    results, missing = [], []
    for raw in args.task_ids:
        task_id = raw.removeprefix(TASK_PK_PREFIX)  # as the stream's keys name it, or bare
        result = purge_task(store, task_id)  # a live task, or one not let go of, raises IllegalTransition: exit 1
        if result.items == 0 and result.objects == 0:  # no META, no item, no payload: not found (exit 1)
            missing.append(task_id)
            print(f"agentq purge: no task {task_id!r}: nothing of it is stored (never was, or already purged)",
                  file=sys.stderr)  # fmt: skip
            continue
        results.append(result)
        if not args.json:
            print(f"{task_id}: {result.items} item(s), {result.objects} payload object(s) deleted")
    if args.json:
        print(json.dumps([r.model_dump() for r in results]))
    return 1 if missing else 0


def register(sub: Any) -> None:
    keys = add_command(sub, "keys", "create, list or revoke API keys (talks to the table: AGENTQ_* and AWS_* settings)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    keys_create = keys_sub.add_parser(
        "create", help="a new key for a tenant, printed once", description="a new key for a tenant, printed once"
    )
    keys_create.add_argument("--tenant", required=True, help="the tenant the key acts as")
    keys_create.add_argument(
        "--operator",
        action="store_true",
        help="the key may also read every tenant's running and waiting counts (GET /usage/tenants)",
    )
    keys_create.add_argument(
        "--act-for-users",
        action="store_true",
        help="requests with the key may name the end user they act for (a submission's user; default: not)",
    )
    keys_create.add_argument("--json", action="store_true", help="print key, key_id, tenant and operator as JSON")
    keys_revoke = keys_sub.add_parser("revoke", help="revoke a key by its id", description="revoke a key by its id")
    keys_revoke.add_argument("key_id", help="the key's id (key_...), as printed by create and list")
    keys_list = keys_sub.add_parser("list", help="a tenant's key ids", description="a tenant's key ids")
    keys_list.add_argument("--tenant", required=True, help="whose keys")
    keys_list.add_argument("--json", action="store_true", help="print JSON")
    keys.set_defaults(func=_cmd_keys)

    tenants = add_command(
        sub, "tenants", "a tenant's running limit and its running and waiting tasks (AGENTQ_* and AWS_* settings)"
    )
    tenants_sub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    tenants_limit = tenants_sub.add_parser(
        "limit", help="set a tenant's most running tasks (its override of the deployment's default)",
        description="set a tenant's most running tasks, sub-agents included (its override of the deployment's "
        "AGENTQ_DEFAULT_TENANT_MAX_RUNNING); lowering it below its running count stops nothing: new tasks wait. "
        f"{FULL_FLEET_NOTE}",
    )  # fmt: skip
    tenants_limit.add_argument("tenant", help="a tenant with an API key or a task")
    limit_or_clear = tenants_limit.add_mutually_exclusive_group()  # both at once: which one was meant?
    limit_or_clear.add_argument(
        "--max-running", type=int, help="at least 1; at the fleet's capacity, the tenant may fill the fleet (see above)"
    )
    limit_or_clear.add_argument("--clear", action="store_true", help="remove the override: the default applies")
    weight_or_clear = tenants_limit.add_mutually_exclusive_group()
    weight_or_clear.add_argument(
        "--weight",
        type=int,
        help="its share of a full fleet against the others' (a whole number, 1 to 1000; default 1)",
    )
    weight_or_clear.add_argument("--clear-weight", action="store_true", help="back to the default weight, 1")
    tenants_limit.add_argument("--json", action="store_true", help="print JSON")
    tenants_usage = tenants_sub.add_parser(
        "usage", help="running and waiting tasks per tenant, each limit and weight (no TENANT: every tenant)"
    )
    tenants_usage.add_argument("tenants", nargs="*", metavar="TENANT")
    tenants_usage.add_argument("--json", action="store_true", help="print JSON")
    tenants.set_defaults(func=_cmd_tenants)

    dlq = add_command(sub, "dlq", "inspect or redrive the dead-letter queues (AGENTQ_* and AWS_* settings)")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    dlq_list = dlq_sub.add_parser("list", help="messages in the DLQs, with their task and reason")
    dlq_list.add_argument("--tier", choices=["high", "normal", "low"], help="one tier only")
    dlq_list.add_argument("--limit", type=int, default=100, help="messages to show")
    dlq_list.add_argument("--json", action="store_true", help="print JSON")
    dlq_redrive = dlq_sub.add_parser(
        "redrive", help="move DLQ messages back; their tasks resume from their checkpoints"
    )
    dlq_redrive.add_argument("--tier", choices=["high", "normal", "low"], help="one tier only")
    dlq.set_defaults(func=_cmd_dlq)

    purge = add_command(sub, "purge", "delete what finished tasks left behind: items, budget, payloads (AGENTQ_* and AWS_* settings)",
                        "delete everything finished tasks left behind (their items, budget and S3 payloads), as the "
                        "reaper does once TTL removed their META; refuses a task that is not finished, or whose worker has "
                        "not let go of it yet (cancelled mid-call): nothing deleted, purge it again later")  # fmt: skip
    purge.add_argument(
        "task_ids", nargs="+", metavar="TASK_ID", help="task ids (or TASK#<id> as a stream record names them)"
    )
    purge.add_argument("--json", action="store_true", help="print what was deleted as JSON")
    purge.set_defaults(func=_cmd_purge)
