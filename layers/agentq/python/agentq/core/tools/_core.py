"""Tools an agent may call: how they are declared, described to the model and run.

A tool is a plain typed function. ``@tool`` derives its JSON schema from the type hints with
pydantic, so the schema the model sees and the validation its input gets cannot drift apart.
``ToolRegistry.execute`` turns every possible failure (unknown name, tool not allowed, bad
input, an exception, a timeout) into a ``ToolExecution`` the engine can hand straight back
to the model as a ``tool_result``: a misbehaving tool costs one step, never the whole task.

Every result and error text leaves ``execute`` redacted (``observe.redaction``) whole, before it
is cut to its length: a cut made first could leave all but the end of a credential's value, which
no spelling of it matches, and the model chooses what comes before it.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import inspect
import json
import logging
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict

from agentq.core.graders import GraderSpec
from agentq.core.tools._context import DeadlineNear, ToolContext
from agentq.core.tools._schema import input_schema
from agentq.observe.redaction import redact

logger = logging.getLogger("agentq.tools")

# Anthropic's rule for tool names; checked at declaration so a bad name fails in a unit test,
# not as a 400 from the API in the middle of a task.
TOOL_NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # fullmatch

# A runaway tool must not blow up the model's context (or the step item it is stored in).
MAX_RESULT_CHARS = 100_000

# Error texts quote exception messages; a tool that raises with a megabyte of text should not
# cost a megabyte of context.
MAX_ERROR_CHARS = 2_000


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool. Calling it calls the function unchanged, so unit tests stay plain;
    only ``ToolRegistry.execute`` validates input, injects the context and enforces time."""

    name: str
    description: str
    side_effects: bool
    timeout_seconds: float
    fn: Callable[..., Any]
    input_model: type[BaseModel]
    wants_context: str | None  # name of the ToolContext parameter, if any
    # A tool described by a schema of its own (an MCP server's): ``fn`` gets the input as
    # ``arguments`` (a dict) and the server validates it; ``input_model`` is not used.
    raw_schema: dict[str, Any] | None = None
    # The tool ends by ``ctx.deadline`` on its own, having killed whatever it started
    # (``ToolContext.bound``: the sandboxed tools). In a task with a workspace the registry
    # waits for it (up to ``timeout_seconds``) instead of giving up at the deadline, so no
    # process of the call is left writing the workspace the engine then scans.
    bounds_itself: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def schema(self) -> dict[str, Any]:
        """The tool as the Messages API ``tools`` parameter wants it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": copy.deepcopy(self.raw_schema or input_schema(self.input_model)),
        }


@typing.overload
def tool(fn: Callable[..., Any]) -> ToolSpec: ...


@typing.overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    timeout_seconds: float = 30.0,
    bounds_itself: bool = False,
) -> Callable[[Callable[..., Any]], ToolSpec]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    timeout_seconds: float = 30.0,
    bounds_itself: bool = False,
) -> ToolSpec | Callable[[Callable[..., Any]], ToolSpec]:
    """Declare a function as a tool; usable bare (``@tool``) or with options.

    ``side_effects=True`` tells the engine the call changes the world, so after a crash it must
    not blindly re-run it (it reports an unknown outcome or relies on the idempotency key).
    Parameters become the input schema: a default makes a parameter optional and
    ``Annotated[..., Field(description=...)]`` documents it for the model. A parameter
    annotated ``ToolContext`` (or ``ToolContext | None``) is left out and injected at call time.
    ``bounds_itself=True`` promises that the tool ends by the context's deadline on its own
    (``ToolSpec.bounds_itself``).
    """

    def decorate(f: Callable[..., Any]) -> ToolSpec:
        return _build_spec(
            f,
            name=name,
            description=description,
            side_effects=side_effects,
            timeout_seconds=timeout_seconds,
            bounds_itself=bounds_itself,
        )

    if fn is not None:
        return decorate(fn)
    return decorate


def _build_spec(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    side_effects: bool,
    timeout_seconds: float,
    bounds_itself: bool = False,
) -> ToolSpec:
    tool_name = name or fn.__name__
    if not TOOL_NAME_PATTERN.fullmatch(tool_name):
        raise ValueError(f"tool name {tool_name!r} must match {TOOL_NAME_PATTERN.pattern}")
    if not timeout_seconds > 0:
        raise ValueError(f"tool {tool_name!r}: timeout_seconds must be positive, got {timeout_seconds}")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # NameError for an unresolvable forward reference, mostly
        raise TypeError(f"tool {tool_name!r}: cannot resolve the type hints of {fn.__qualname__}: {exc}") from exc

    fields: dict[str, Any] = {}
    wants_context: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            # Input arrives as a JSON object, so every parameter must be passable by keyword.
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} must be a plain keyword-capable parameter")
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            if wants_context is not None:
                raise TypeError(f"tool {tool_name!r}: more than one ToolContext parameter")
            wants_context = param.name
            continue
        if param.name.startswith("_"):
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} cannot start with an underscore")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)

    model_name = "".join(part.capitalize() for part in re.split(r"[_-]+", tool_name) if part) + "Input"
    input_model: type[BaseModel] = pydantic.create_model(
        model_name,
        __config__=ConfigDict(extra="forbid", protected_namespaces=()),
        __module__=getattr(fn, "__module__", __name__),
        **fields,
    )
    input_schema(input_model)  # fail at declaration if the hints cannot be expressed in JSON schema
    return ToolSpec(
        name=tool_name,
        description=description if description is not None else _first_paragraph(inspect.getdoc(fn)),
        side_effects=side_effects,
        timeout_seconds=float(timeout_seconds),
        fn=fn,
        input_model=input_model,
        wants_context=wants_context,
        bounds_itself=bounds_itself,
    )


def _is_context(annotation: Any) -> bool:
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if annotation is ToolContext:
        return True
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return members == [ToolContext]
    return False


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


# --- execution --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolExecution:
    """One call's outcome, already worded for the model."""

    content: str  # what the model sees as tool_result content
    is_error: bool
    status: Literal["ok", "error", "timeout"]
    duration_ms: int
    tool_failed: bool = False  # what the tool depends on was unreachable (``backend_down``): its circuit counts it


class ToolRegistry:
    """The tools a worker can run. Which of them a task may use is the task's allowlist,
    passed per call, so one registry serves every task."""

    def __init__(self, tools: Iterable[ToolSpec] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        # The deployment's @grader functions (core.grading), from the same tool modules: an
        # outcome names one, the API checks the name and the worker runs it.
        self._graders: dict[str, GraderSpec] = {}
        for spec in tools:
            self.register(spec)

    def register(self, spec: ToolSpec) -> ToolSpec:
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"expected a ToolSpec (decorate the function with @tool), got {type(spec).__name__}")
        if spec.name in self._tools:
            raise ValueError(f"a tool named {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        return spec

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def register_grader(self, spec: GraderSpec) -> GraderSpec:
        if not isinstance(spec, GraderSpec):
            raise TypeError(f"expected a GraderSpec (decorate the function with @grader), got {type(spec).__name__}")
        if spec.name in self._graders:
            raise ValueError(f"a grader named {spec.name!r} is already registered")
        self._graders[spec.name] = spec
        return spec

    def grader(self, name: str) -> GraderSpec | None:
        return self._graders.get(name)

    def grader_names(self) -> list[str]:
        return list(self._graders)

    def with_tools(self, extra: Iterable[ToolSpec]) -> ToolRegistry:
        """This registry plus ``extra`` (a task's MCP tools), leaving this one unchanged."""
        extra = list(extra)
        if not extra:
            return self
        combined = ToolRegistry()
        combined._tools = dict(self._tools)
        combined._graders = self._graders
        for spec in extra:
            combined.register(spec)
        return combined

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self, allowlist: Iterable[str]) -> list[dict[str, Any]]:
        """Only allowlisted, registered tools, in allowlist order: the model is never told
        about a tool it would then be refused."""
        return [self._tools[n].schema() for n in dict.fromkeys(allowlist) if n in self._tools]

    def unknown(self, names: Iterable[str]) -> list[str]:
        """Names not registered, so a submission naming them can be refused up front."""
        return [n for n in dict.fromkeys(names) if n not in self._tools]

    def execute(
        self, name: str, raw_input: dict[str, Any], ctx: ToolContext, allowlist: Iterable[str]
    ) -> ToolExecution:
        """Run one tool call. Never raises for a tool problem: every failure is a result.

        The function runs in a worker thread so a slow call can be abandoned at
        ``timeout_seconds`` (or ``ctx.deadline``, whichever is sooner). A Python thread cannot
        be killed, so a timed-out pure-Python tool may keep running in the background until it
        returns on its own (its thread is a daemon, so it never holds up interpreter exit).
        Tools that need a hard kill, like ``python_exec``, do their work in a subprocess and
        bound it themselves; in a task with a workspace such a tool (``bounds_itself``) is
        waited for past the deadline, never abandoned with its processes still writing there.
        """
        started = time.monotonic()

        def result(
            content: str, status: Literal["ok", "error", "timeout"] = "error", *, failed: bool = False
        ) -> ToolExecution:
            return ToolExecution(
                content=_cap(redact(content)),  # redacted whole, then cut: never a value's prefix
                is_error=status != "ok",
                status=status,
                duration_ms=int((time.monotonic() - started) * 1000),
                tool_failed=failed,
            )

        try:
            allowed = list(dict.fromkeys(allowlist))
            spec = self._tools.get(name)
            if spec is None:
                available = [n for n in allowed if n in self._tools]
                return result(f"unknown tool {name!r}; available: {', '.join(available) or '(none)'}")
            if name not in allowed:
                return result(f"tool {name!r} is not allowed for this task")
            if spec.raw_schema is not None:  # the model's input is a JSON object (the API's rule)
                kwargs: dict[str, Any] = {"arguments": dict(raw_input)}
            else:
                try:
                    validated = spec.input_model.model_validate(raw_input)
                except pydantic.ValidationError as exc:
                    return result(f"invalid input for tool {name!r}: {_describe_validation_error(exc)}")
                kwargs = {field: getattr(validated, field) for field in type(validated).model_fields}
            if spec.wants_context is not None:
                kwargs[spec.wants_context] = ctx

            limit = spec.timeout_seconds
            if ctx.deadline is not None:
                left = ctx.deadline - time.time()
                if left <= 0:
                    return result(f"tool {name!r} timed out after 0.0s (the task deadline has passed)", "timeout")
                # A tool that kills what it started at its own bound is waited for when what it
                # started may write the workspace; elsewhere (python_exec's private /tmp, the
                # sandbox function) giving up at the deadline leaves nothing the engine reads.
                if not (spec.bounds_itself and ctx.workspace is not None):
                    limit = min(limit, left)

            future = _run_in_thread(spec, kwargs)
            done, _ = wait([future], timeout=limit)
            if not done:
                logger.warning("tool %s timed out after %.1fs (task %s)", name, limit, ctx.task_id)
                return result(f"tool {name!r} timed out after {limit:.1f}s", "timeout")
            failure = future.exception()
            if isinstance(failure, DeadlineNear):
                return result(f"tool {name!r} was not started: {failure}", "timeout")
            if failure is not None:
                logger.info("tool %s raised (task %s)", name, ctx.task_id, exc_info=failure)
                return result(_describe_exception(failure), failed=backend_down(failure))
            return result(render_result(future.result()), "ok")
        except Exception as exc:  # the contract is "never raises": even our own bugs become a result
            logger.exception("tool %s failed in the registry (task %s)", name, getattr(ctx, "task_id", "?"))
            return result(_describe_exception(exc))


def _run_in_thread(spec: ToolSpec, kwargs: dict[str, Any]) -> Future[Any]:
    """A daemon thread per call rather than a shared pool: an abandoned (timed-out) call must
    neither occupy a pool slot forever nor keep the process alive at exit."""
    future: Future[Any] = Future()
    context = contextvars.copy_context()  # keep log correlation (task id...) in the tool's logs

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            value = context.run(spec.fn, **kwargs)
        except BaseException as exc:  # SystemExit from a tool is still just a failed call
            future.set_exception(exc)
        else:
            future.set_result(value)

    threading.Thread(target=run, name=f"agentq-tool-{spec.name}", daemon=True).start()
    return future


def render_result(value: Any) -> str:
    """Turn a return value into tool_result text: strings as they are, structures as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, (dict, list, tuple, int, float, bool)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def _describe_validation_error(exc: pydantic.ValidationError) -> str:
    """One ``field: reason`` per problem, so the model can fix exactly what was wrong."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(input)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def backend_down(exc: BaseException) -> bool:
    """Whether a tool's exception says what it depends on is unreachable (a network error, a
    timeout, an exception marked ``backend_down``), which its circuit counts; a refusal or a
    bug caused by the model's input is the call's own problem and does not."""
    return isinstance(exc, OSError) or bool(getattr(exc, "backend_down", False))


def _describe_exception(exc: BaseException) -> str:
    message = redact(str(exc))  # before the cut, as every text of execute (see the module)
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "..."
    return f"ToolError: {type(exc).__name__}: {message}" if message else f"ToolError: {type(exc).__name__}"


def _cap(content: str) -> str:
    if len(content) <= MAX_RESULT_CHARS:
        return content
    return content[:MAX_RESULT_CHARS] + f"\n[result truncated: {MAX_RESULT_CHARS} of {len(content)} characters shown]"
