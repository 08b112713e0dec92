"""A2A's push notification configs (Create / Get / List / Delete ``TaskPushNotificationConfig``),
the A2A server's methods for them (mixed into ``api/a2a_server.AgentqRequestHandler``).

A config names where to POST the task's changes: its ``url`` is checked as a callback's is
(``core.webhooks.check_url``: https only, never an internal address, unless
``AGENTQ_WEBHOOK_ALLOW`` names the host, as for a development receiver on 127.0.0.1), and a
refused one is the protocol's ``InvalidParamsError`` naming ``url``, nothing stored; so is a
``token``, ``authentication.scheme`` or ``authentication.credentials`` no push could send as a
header (``_sendable``). Only the
caller's own task takes one (another tenant's, another user's, another agent's or an unknown id
is ``TaskNotFoundError``, as for every method). A task that ended takes one too (the protocol
keeps a config "until task completion or deletion", and clients set one on whatever task they
hold), though nothing more will be sent for it. The configs live in ``storage/a2a_push.py``; what is sent, and how, is
``queueing/a2a_push.py``: the change as a ``StreamResponse`` when the task waits for someone or
ends, signed as every callback, retried until taken.

Push configs are the tenant's (its API keys'). A push is signed with the tenant's callback secret
for the tenant's backend, as an agent's ``notify`` is, which a token may not set for that reason
(``api/user_submission.py``): a config a token set on its own task had the tenant's signed pushes
POSTed to a server of the user's. So to an end user's token (``Caller.bound``), whose card says
``pushNotifications: false``, all four methods are the protocol's
``PushNotificationNotSupportedError`` naming the field (``refuse_push``), as A2A 1.0 (3.3.4) says
of an agent that declares none: it sets none, with a send or on its own (nothing stored), deletes
none (the tenant's backend would hear nothing more) and reads none (the tenant's hold the
credentials its receiver checks; before, Get and List answered as if supported, without them).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from agentq.api.routes.common import ApiDeps
from agentq.core.endusers import Caller
from agentq.core.errors import ValidationError
from agentq.core.models import Task
from agentq.core.webhooks import check_url
from agentq.storage.a2a_push import MAX_CONFIGS

MAX_ID = 128
MAX_TOKEN = 1024
SCHEME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")  # RFC 9110's token: an auth-scheme


def _errors() -> Any:
    from a2a.utils import errors

    return errors


def _invalid(message: str, field: str) -> Exception:
    return _errors().InvalidParamsError(message=f"{field}: {message}", data={"field": field})  # type: ignore[no-any-return]


def _config_out(raw: dict[str, Any]) -> Any:
    """A stored config as the protocol's (read by the tenant's keys only: ``refuse_push``)."""
    from a2a.types import TaskPushNotificationConfig
    from google.protobuf.json_format import ParseDict

    return ParseDict(raw, TaskPushNotificationConfig(), ignore_unknown_fields=True)


def refuse_push(caller: Caller, field: str) -> None:
    """An end user's token sets, reads and deletes no push config (the module's docstring says
    why): the protocol's PushNotificationNotSupported, which its card announces, naming ``field``."""
    if caller.bound:
        message = (f"{field}: push notifications are the tenant's: they are signed with its callback secret for its "
                   f"backend, so the token of end user {caller.user!r} may not set, read or delete a push config (an "
                   "API key of the tenant may); nothing was stored")  # fmt: skip
        raise _errors().PushNotificationNotSupportedError(message=message, data={"field": field})


def _sendable(value: str, field: str) -> None:
    """A value each push sends as a header's (``X-A2A-Notification-Token``, ``Authorization``):
    printable Latin-1 only. A CR or LF (a header of the client's in every push) or a character
    beyond Latin-1 cannot be sent (``http.client`` refuses it): every push of the config was
    dead-lettered, the client told nothing when it set it; another control character (NUL, DEL)
    is in no field value HTTP allows (RFC 9110), which a receiver refuses."""
    bad = next((c for c in value if not (" " <= c <= "~" or "\xa0" <= c <= "\xff")), None)
    if bad is not None:
        raise _invalid(f"sent as an HTTP header's value, it holds printable Latin-1 characters only, not "
                       f"{bad!r} (at {value.index(bad)})", field)  # fmt: skip


def config_in(params: Any, task_id: str) -> tuple[str, dict[str, Any]]:
    """The config to store (its id drawn when the client gave none), checked; raises the
    protocol's InvalidParams naming the field."""
    from google.protobuf.json_format import MessageToDict

    if not params.url:
        raise _invalid("required", "url")
    if len(params.id) > MAX_ID:
        raise _invalid(f"at most {MAX_ID} characters", "id")
    if len(params.token) > MAX_TOKEN:
        raise _invalid(f"at most {MAX_TOKEN} characters", "token")
    if params.HasField("authentication") and not params.authentication.scheme:
        raise _invalid("required with authentication", "authentication.scheme")
    _sendable(params.token, "token")
    if params.HasField("authentication"):
        if not SCHEME.fullmatch(params.authentication.scheme):
            raise _invalid("an HTTP authentication scheme: one token of letters, digits and !#$%&'*+-.^_`|~ "
                           "(Bearer, Basic)", "authentication.scheme")  # fmt: skip
        _sendable(params.authentication.credentials, "authentication.credentials")
    try:
        check_url(params.url, field="url")
    except ValidationError as exc:
        raise _invalid(exc.message.removeprefix("url: "), "url") from None
    config_id = params.id or uuid.uuid4().hex
    raw = MessageToDict(params)
    raw.pop("tenant", None)
    return config_id, {**raw, "id": config_id, "taskId": task_id}


class PushConfigMethods:
    """The four methods; the class they are mixed into gives ``deps``, ``_caller`` (whom the
    request acts for), ``_owned`` (the caller's task of this agent, or TaskNotFound) and
    ``_store_call`` (a store call off the event loop, agentq's refusals as the protocol's errors)."""

    deps: ApiDeps
    _caller: Callable[[], Caller]
    _owned: Callable[[str], Task]
    _store_call: Callable[[Callable[[], Any]], Any]

    def _store_push(self, task_id: str, tenant: str, params: Any) -> tuple[str, Any]:
        """Store the config for ``task_id`` (which may not exist yet: a send stores its config
        under the id its task will be created with); its id and the protocol's view of it."""
        push = self.deps.store.a2a_push
        config_id, raw = config_in(params, task_id)
        known = push.listed(task_id)
        if len(known) >= MAX_CONFIGS and all(c.get("id") != config_id for c in known):
            raise _invalid(f"a task holds at most {MAX_CONFIGS} push configs; delete one first", "id")
        push.put(task_id, tenant, config_id, raw)
        return config_id, _config_out(raw)

    def _store_push_undoably(self, task_id: str, tenant: str, params: Any) -> tuple[str, Callable[[], None]]:
        """``_store_push``, and how to take it back if what it came with is refused: delete the
        config, or put back the one of the same id it replaced."""
        push = self.deps.store.a2a_push
        prior = push.get(task_id, params.id) if params.id else None
        config_id, _ = self._store_push(task_id, tenant, params)

        def undo() -> None:
            if prior is None:
                push.delete(task_id, config_id)
            else:
                push.put(task_id, tenant, config_id, prior)

        return config_id, undo

    async def on_create_task_push_notification_config(self, params: Any, context: Any) -> Any:
        def create() -> Any:
            task = self._owned(params.task_id)  # another's task: TaskNotFound, as for every method
            refuse_push(self._caller(), "url")
            return self._store_push(task.task_id, task.tenant, params)[1]

        return await self._store_call(create)

    async def on_get_task_push_notification_config(self, params: Any, context: Any) -> Any:
        def get() -> Any:
            task = self._owned(params.task_id)
            refuse_push(self._caller(), "id")
            raw = self.deps.store.a2a_push.get(task.task_id, params.id) if params.id else None
            if raw is None:
                raise _errors().TaskNotFoundError(message=f"task {task.task_id} has no push config {params.id!r}")
            return _config_out(raw)

        return await self._store_call(get)

    async def on_list_task_push_notification_configs(self, params: Any, context: Any) -> Any:
        from a2a.types import ListTaskPushNotificationConfigsResponse

        def listed() -> Any:
            task = self._owned(params.task_id)
            refuse_push(self._caller(), "taskId")
            configs = [_config_out(raw) for raw in self.deps.store.a2a_push.listed(task.task_id)]
            return ListTaskPushNotificationConfigsResponse(configs=configs)  # at most MAX_CONFIGS: one page

        return await self._store_call(listed)

    async def on_delete_task_push_notification_config(self, params: Any, context: Any) -> None:
        def delete() -> None:
            task = self._owned(params.task_id)
            refuse_push(self._caller(), "id")
            if params.id:
                self.deps.store.a2a_push.delete(task.task_id, params.id)  # again, or an unknown id: the same

        await self._store_call(delete)
