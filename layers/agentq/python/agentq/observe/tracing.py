"""X-Ray subsegments through the powertools Tracer, or nothing at all when tracing is off.

The Tracer is built only in Lambda (``LAMBDA_TASK_ROOT`` set): building one elsewhere would
import the X-Ray SDK and switch it off process-wide, for no trace. In Lambda, powertools has
the last word (``POWERTOOLS_TRACE_DISABLED``, SAM local). The core never patches libraries
(``auto_patch=False``); the handlers' own Tracer does, so AWS SDK calls nest under the
function's segment beside the subsegments opened here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aws_lambda_powertools import Tracer

# Where the OpenTelemetry GenAI attributes go, under their dotted names, in subsegment metadata
# (annotations are indexed and searchable but take only [A-Za-z0-9_] keys and scalar values).
GENAI_METADATA_NAMESPACE = "gen_ai"


@functools.cache
def active_tracer() -> Tracer | None:
    """The process's Tracer, or None when traces would go nowhere (decided once)."""
    if not os.environ.get("LAMBDA_TASK_ROOT"):
        return None
    tracer = Tracer(auto_patch=False)
    return None if tracer.disabled else tracer


class Span:
    """A subsegment to annotate. ``Span(None)`` (tracing off, or no segment to hang it from)
    accepts everything and records nothing, so callers never branch on tracing."""

    def __init__(self, subsegment: Any | None) -> None:
        self._subsegment = subsegment

    @property
    def recording(self) -> bool:
        return self._subsegment is not None

    def annotate(self, **values: str | float | bool | None) -> None:
        """Indexed, searchable (``annotation.task_id = "..."`` in the X-Ray console)."""
        if self._subsegment is None:
            return
        for key, value in values.items():
            if value is not None:
                self._subsegment.put_annotation(key, value)

    def describe(self, attributes: dict[str, Any]) -> None:
        """OpenTelemetry attributes by their own (dotted) names, as metadata."""
        if self._subsegment is None:
            return
        for key, value in attributes.items():
            if value is not None:
                self._subsegment.put_metadata(key, value, GENAI_METADATA_NAMESPACE)


@contextmanager
def span(name: str) -> Iterator[Span]:
    """A subsegment named ``name`` around the block; an exception leaving the block is
    recorded on it (the X-Ray SDK's context manager does that) and goes on."""
    tracer = active_tracer()
    if tracer is None:
        yield Span(None)
        return
    with tracer.provider.in_subsegment(name) as subsegment:
        yield Span(subsegment)
