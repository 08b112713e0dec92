"""The base of every model a caller sends or a worker persists: an unknown field is refused,
so a misspelt field is a 422 naming it, never a silently ignored setting."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# How deep a request body may nest: the API refuses deeper (``api.body_guard``), and a client
# that builds bodies from a file checks it first (``core.evaluations``). Far beyond any
# submission's shape (a script's tool input nests ~6 levels).
MAX_JSON_DEPTH = 64


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
