"""Each tenant's callback signing secret (``TENANT#<tenant>``/``WEBHOOK``): made on first use
(a conditional put, so two first uses agree on one), read by the delivery and by the tenant
through the API to verify what it receives (``core.webhooks.verify``)."""

from __future__ import annotations

import secrets

from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Table, absent, plain


class WebhookSecrets:
    def __init__(self, table: Table) -> None:
        self.table = table

    def _key(self, tenant: str) -> dict[str, str]:
        return {"pk": keys.tenant_pk(tenant), "sk": "WEBHOOK"}

    def get_or_create(self, tenant: str) -> str:
        item = self.table.get(self._key(tenant))
        if item is not None:
            return str(plain(item)["secret"])
        secret = "whsec_" + secrets.token_hex(32)
        try:
            self.table.put({**self._key(tenant), "secret": secret}, condition=absent())
        except ConditionFailed:
            return str(plain(self.table.get(self._key(tenant)) or {})["secret"])
        return secret
