"""moto appends every model object it ever creates to a list on its class
(``BaseModel.__new__`` -> ``cls.instances_tracked``), for its dashboard (``/moto-api/data.json``),
and never removes one: every DynamoDB ``Item`` (moto deep-copies items on each update, each
transaction and each response), every stream record, every SQS message stays alive for as long
as the server runs, deleted or not. Under load that was ~210 KB per task
(docs/BENCHMARKS.md). The local server does not track them; its dashboard then shows no model
objects, which nothing in agentq reads.
"""

from __future__ import annotations

from typing import Any

from agentq_dev import moto_version


@moto_version.verified_patch
def install() -> None:
    """Stop tracking model instances (idempotent; existing tracked lists are emptied)."""
    from moto.core.common_models import BaseModel
    from moto.core.model_instances import reset_model_data

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(cls)

    BaseModel.__new__ = __new__  # type: ignore[method-assign]
    reset_model_data()
