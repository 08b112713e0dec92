"""Where the core's log lines (the ``agentq.*`` stdlib loggers) go, and in what shape.

- Lambda: through the function's powertools ``Logger`` (``route_core_logs``), so a line from
  ``agentq.core.engine`` is the same JSON as the handler's own: service, Lambda context, the
  logger's name, and the task's correlation fields as top-level keys.
- ``agentq worker``: ``configure_process_logging``; JSON the same way with
  ``AGENTQ_LOG_FORMAT=json`` (what Fargate sets, for CloudWatch Logs Insights), else text
  lines that end with the task's fields.

Either way every handler redacts credentials' values (``observe.redaction``).
"""

from __future__ import annotations

import logging
import os

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from agentq.observe.correlation import FIELDS, CorrelationFilter, has_correlation_filter
from agentq.observe.redaction import REDACTOR

CORE_LOGGER = "agentq"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
WORKER_SERVICE = "agentq-worker"


class RedactingFilter(logging.Filter):
    """Rewrites a record whose message or traceback holds a credential; never drops one. By every
    value the process holds (``REDACTOR``), whichever run logs: a line redacted of too much
    loses an operator a word, never a tenant its data (``current``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if REDACTOR.empty:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string is the formatter's to report
            return True
        cleaned = REDACTOR.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[0] is not None:
            # Formatters (powertools' JSON one) format exc_info themselves: a traceback that
            # holds a credential is folded into the message, redacted, and exc_info dropped.
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            clean = REDACTOR.redact(text)
            if clean != text:
                record.msg, record.args = f"{record.getMessage()}\n{clean}", None
                record.exc_info, record.exc_text = None, None
        if record.stack_info:
            record.stack_info = REDACTOR.redact(record.stack_info)
        return True


def has_redacting_filter(handler: logging.Handler) -> bool:
    return any(isinstance(f, RedactingFilter) for f in handler.filters)


def route_core_logs(logger: Logger) -> None:
    """``agentq.*`` records through ``logger``'s handler (and so its JSON formatter), with the
    task's fields added to every line that handler writes, the handler's own included."""
    logging.getLogger(CORE_LOGGER)  # registered, so powertools finds it
    copy_config_to_registered_loggers(source_logger=logger, include={CORE_LOGGER})
    for handler in logger.handlers:
        if not has_correlation_filter(handler):
            handler.addFilter(CorrelationFilter())
        if not has_redacting_filter(handler):  # a credential's value never reaches a log line
            handler.addFilter(RedactingFilter())


class CorrelatedTextFormatter(logging.Formatter):
    """Text lines for people: the message, then ``task_id=... step=...`` when in a task."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={record.__dict__[k]}" for k in FIELDS if record.__dict__.get(k) is not None)
        return f"{line} [{fields}]" if fields else line


def configure_process_logging(level: int | None = None, log_format: str | None = None) -> None:
    """A long-running process's logging (``agentq worker``): ``log_format`` "json" or "text",
    by default ``$AGENTQ_LOG_FORMAT`` (text when unset); ``level`` for agentq's own lines, by
    default ``$POWERTOOLS_LOG_LEVEL`` (what the stack sets) or WARNING. Other libraries log
    at WARNING."""
    if level is None:
        named = logging.getLevelName(os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING").upper())
        level = named if isinstance(named, int) else logging.WARNING
    chosen = (log_format or os.environ.get("AGENTQ_LOG_FORMAT") or "text").lower()
    if chosen not in ("json", "text"):
        raise ValueError(f"AGENTQ_LOG_FORMAT must be json or text, not {chosen!r}")
    if chosen == "json":
        logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or WORKER_SERVICE, level=level)
        route_core_logs(logger)
        handlers = list(logger.handlers)
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(CorrelatedTextFormatter(TEXT_FORMAT))
        handler.addFilter(CorrelationFilter())
        handler.addFilter(RedactingFilter())
        core = logging.getLogger(CORE_LOGGER)
        core.handlers = [handler]
        core.propagate = False
        core.setLevel(level)
        handlers = [handler]
    logging.basicConfig(level=logging.WARNING, handlers=handlers, force=True)
