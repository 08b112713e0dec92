"""The key schema of the single table: every partition and sort key agentq writes, defined once.

A task's items share its partition (``TASK#id``), so one Query reads its history in commit
order and one purge finds all of it (a task's budget is on its META: ``storage.budgets``).
A tenant's hourly windows and limits live under ``TENANT#t``. API keys have two items: ``APIKEY#<sha256>``,
what the authorizer reads by the key it was shown, and ``APIKEYID#<key_id>``, what a revoke
finds by id and the tenant's listing (``gsi1pk = KEYS#<tenant>``) holds. Sort keys carry
zero-padded numbers so that they sort as text in the order they were written.

This module imports nothing of agentq's (the authorizer Lambda loads it; ``agentq.resources``
re-exports ``PAYLOAD_PREFIX`` for the stack's IAM policies).
"""

from __future__ import annotations

import hashlib
import re
import uuid

PAYLOAD_PREFIX = "tasks/"  # every S3 key the storage offloads a payload to: tasks/<task_id>/...
META = "META"
STEP = "STEP#"
EFFECT = "EFFECT#"
NOTE = "NOTE#"
SPAWN = "SPAWN#"
APPROVAL = "APPROVAL#"
DECISION = "DECISION#"  # in a task's partition: DECISION#<digest>, the held call a decision request decides
ORPHAN = "ORPHAN#"
CLAIM = "CLAIM#"
EVENT = "EVENT#"  # a task's logged event (storage/events.py), numbered by META's seq
DEPENDENT = "DEPENDENT#"  # in a task's partition: a task that waits for it (depends_on)
SUBMISSION = "META#SUBMISSION"  # sorts right after META: one Query reads both
FIRST_END = "FIRSTEND"  # a task's first end, kept when it was reopened (storage/task_items.first_end_writes)
RETRY = "META#RETRY"  # the latest retry (RetryState): read by the same Query
LIMITS = "LIMITS"
HOUR = "HOUR#"
CAP = "CAP#"  # in TENANT#t: CAP#<scope>#<name>, a scope's caps (storage/scope_caps.py)
CAP_USE = "CAPUSE#"  # in TENANT#t: CAPUSE#<scope>#<name>#<day>, what the scope held that day and each hour
QUALITY = "QUALITY#"  # in TENANT#t: QUALITY#<agent>#<hour>#V#<version>, online grades (storage/quality.py)
ONLINE = "ONLINE#"  # in a task's partition: ONLINE#<step> (a grade) or ONLINE#end (an unanswered end) counted

Key = dict[str, str]


def new_task_id() -> str:
    return uuid.uuid4().hex


def task_pk(task_id: str) -> str:
    return f"TASK#{task_id}"


def a2a_push_pk(task_id: str) -> str:
    """The partition of a task's A2A push configs (``storage/a2a_push.py``): not the task's own,
    so nothing that reads or deletes a task's partition meets them."""
    return f"A2APUSH#{task_id}"


def task_id_of(pk: str) -> str:
    return pk.split("#", 1)[1]


def tenant_pk(tenant: str) -> str:
    """The partition of a tenant's windows and limits, and (in ``gsi1``) of its tasks."""
    return f"TENANT#{tenant}"


def user_tasks_pk(tenant: str, user: str) -> str:
    """The ``user`` index partition of the tasks acting for one user of one tenant: a digest of
    the pair (neither holds ``#``, so two pairs never share one), 37 bytes whatever their
    lengths, because META carries it and META stays within one write unit (``storage.tasks``)."""
    return "USER#" + hashlib.sha256(f"{tenant}#{user}".encode()).hexdigest()[:32]


def vault_pk(tenant: str, user: str | None) -> str:
    """The vault partition of one tenant's (``user`` None) or one user's credentials and of the
    tasks waiting for them: a digest of the pair, as ``user_tasks_pk`` (neither holds ``#``)."""
    return "VAULT#" + hashlib.sha256(f"{tenant}#{user or ''}".encode()).hexdigest()[:32]


def idempotency_pk(tenant: str, key: str) -> str:
    return f"IDEMP#{tenant}#{key}"


def step_sk(number: int) -> str:
    return f"{STEP}{number:06d}"


LAST_STEP_SK = f"{STEP}999999"
# A STEP item's attributes naming the status its commit ended the task with (storage/steps.py),
# which the task's log reads as that step's second event (storage/events.py).
STEP_ENDING = ("finish", "finish_error")


def claim_sk(epoch: int) -> str:
    return f"{CLAIM}{epoch:06d}"


def event_sk(seq: int) -> str:
    return f"{EVENT}{seq:09d}"


def orphan_sk(number: int, epoch: int) -> str:
    return f"{ORPHAN}{number:06d}#e{epoch:04d}"


def hour_sk(hour: str) -> str:
    return f"{HOUR}{hour}"


def cap_key(tenant: str, scope: str, name: str) -> Key:
    return {"pk": tenant_pk(tenant), "sk": f"{CAP}{scope}#{name}"}


def cap_use_key(tenant: str, scope: str, name: str, day: str) -> Key:
    return {"pk": tenant_pk(tenant), "sk": f"{CAP_USE}{scope}#{name}#{day}"}


def meta_key(task_id: str) -> Key:
    return {"pk": task_pk(task_id), "sk": META}


def submission_key(task_id: str) -> Key:
    return {"pk": task_pk(task_id), "sk": SUBMISSION}


def retry_key(task_id: str) -> Key:
    return {"pk": task_pk(task_id), "sk": RETRY}


def item_key(task_id: str, sk: str) -> Key:
    return {"pk": task_pk(task_id), "sk": sk}


def api_key_key(digest: str) -> Key:
    """The item of an API key, by the SHA-256 (hex) of the key: the key itself is never stored."""
    return {"pk": f"APIKEY#{digest}", "sk": META}


def api_key_id_key(key_id: str) -> Key:
    return {"pk": f"APIKEYID#{key_id}", "sk": META}


def key_id_of(pk: str) -> str:
    """The key id in an ``APIKEYID#`` partition key."""
    return pk.split("#", 1)[1]


FLOWS_INDEX_PK = "FLOWS"  # gsi1pk of every flow-control STATE item (gsi1sk: provider/model), storage/flow.py
TENANT_SLOTS_INDEX_PK = "TENANTS"  # gsi1pk of every tenant's running-slot item (gsi1sk: the tenant)


def tenant_keys_pk(tenant: str) -> str:
    """``gsi1pk`` of a tenant's API keys (its tasks are under ``tenant_pk``)."""
    return f"KEYS#{tenant}"


# What ``tenant_index_sk`` makes: a cursor that resumes a listing after it must be one, else the
# listing would read a key that is not there (or split one that has no task id).
TENANT_INDEX_SK = re.compile(r"[0-9]{15}#[A-Za-z0-9_-]{1,128}")


def tenant_index_sk(created_at: float, task_id: str) -> str:
    """``gsi1`` sort key: creation time in epoch milliseconds (15 digits, so it sorts as text),
    then the task id to break ties; a descending query lists newest first."""
    return f"{int(created_at * 1000):015d}#{task_id}"


def payload_prefix(task_id: str) -> str:
    """Every S3 payload of a task is under this prefix (so its purge can list them)."""
    return f"{PAYLOAD_PREFIX}{task_id}/"


def step_payload_key(task_id: str, number: int, epoch: int) -> str:
    return f"{payload_prefix(task_id)}steps/{number:06d}-e{epoch}.json"


def quality_prefix(agent: str) -> str:
    return f"{QUALITY}{agent}#"


def quality_sk(agent: str, hour: int, version: int) -> str:
    """One agent version's online grades of one hour (hours since the epoch), in ``TENANT#t``:
    an agent's hours sort in time order, every version of an hour together."""
    return f"{quality_prefix(agent)}{hour:08d}#V#{version:09d}"


def online_counted_sk(step: int) -> str:
    return f"{ONLINE}{step:08d}"


def online_unanswered_sk() -> str:
    """That a sampled task's ending without an answer was counted: once a task, whatever ends it."""
    return f"{ONLINE}end"


def agent_pk(tenant: str, name: str) -> str:
    """The partition of one agent of one tenant: its ``HEAD`` and every version."""
    return f"AGENT#{tenant}#{name}"


AGENT_HEAD = "HEAD"


def agent_version_sk(version: int) -> str:
    return f"V#{version:09d}"


AGENT_ALIAS_PREFIX = "ALIAS#"


def agent_alias_sk(alias: str) -> str:
    """An alias of the agent (``storage.agent_aliases``), in the agent's partition."""
    return f"{AGENT_ALIAS_PREFIX}{alias}"


# A tenant's policy documents (``storage.policies``) live in its ``TENANT#`` partition, which the
# task runners may read (infra/task_runners.py): the current one of each scope, and every version.
POLICY_HEAD_PREFIX = "POLICY#HEAD#"


def policy_head_sk(scope: str) -> str:
    return f"{POLICY_HEAD_PREFIX}{scope}"


def policy_version_prefix(scope: str) -> str:
    return f"POLICY#V#{scope}#"


def policy_version_sk(scope: str, version: int) -> str:
    return f"{policy_version_prefix(scope)}{version:09d}"


# A tenant's stops (``storage.stops``): one item per stopped scope in its ``TENANT#`` partition,
# read by submissions and by the task runners' claims in one Query of the prefix.
STOP_PREFIX = "STOP#"


def stop_sk(kind: str, value: str) -> str:
    return f"{STOP_PREFIX}{kind}#{value}"


def tenant_agents_pk(tenant: str) -> str:
    """``gsi1pk`` of a tenant's agents (one HEAD item each; ``gsi1sk`` is the name)."""
    return f"AGENTS#{tenant}"


def memory_store_pk(tenant: str, name: str) -> str:
    """The partition of one memory store of one tenant: its ``STORE`` item, documents, versions."""
    return f"MEMSTORE#{tenant}#{name}"


MEMORY_STORE = "STORE"
MEMORY_DOC = "DOC#"  # DOC#<path>: a document's current content (or its tombstone)
MEMORY_VERSION = "VER#"  # VER#<path>#<version, 9 digits>: one change of it


def memory_doc_sk(path: str) -> str:
    return f"{MEMORY_DOC}{path}"


def memory_versions_prefix(path: str) -> str:
    """Every version of ``path`` (a path never holds ``#``, so no other path shares it)."""
    return f"{MEMORY_VERSION}{path}#"


def memory_version_sk(path: str, version: int) -> str:
    return f"{memory_versions_prefix(path)}{version:09d}"


def tenant_memory_stores_pk(tenant: str) -> str:
    """``gsi1pk`` of a tenant's memory stores (one STORE item each; ``gsi1sk`` is the name)."""
    return f"MEMSTORES#{tenant}"
