"""The base of every model a caller sends or a worker persists: an unknown field is refused,
so a misspelt field is a 422 naming it, never a silently ignored setting."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
