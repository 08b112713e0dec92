"""What a client's message to the A2A server (``api/a2a_server.py``) says: its text (text parts,
and data parts as JSON; a file part refused), and, to a task paused for approval, the decision it
carries: a data part ``{"approved": bool, "note": str, "toolUseId": str}``, or text read as one.
"""

from __future__ import annotations

import json
from typing import Any

from agentq.api.models import MAX_NOTE_CHARS, MAX_TOOL_USE_ID_CHARS

APPROVE_WORDS = frozenset({"approve", "approved", "yes", "y", "ok"})
REJECT_WORDS = frozenset({"reject", "rejected", "no", "n", "deny"})


def _errors() -> Any:
    from a2a.utils import errors

    return errors


def _invalid(message: str, field: str) -> Exception:
    return _errors().InvalidParamsError(message=f"{field}: {message}", data={"field": field})  # type: ignore[no-any-return]


def text_of(message: Any) -> str:
    """The message's text: its text parts, and its data parts as JSON; a file (raw or url) part
    is refused, as agentq's goals and messages are text."""
    from google.protobuf.json_format import MessageToDict

    if not message.parts:
        raise _invalid("a message needs at least one part", "message.parts")
    texts: list[str] = []
    for i, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            texts.append(json.dumps(MessageToDict(part.data)))
        else:
            raise _errors().ContentTypeNotSupportedError(
                message=f"message.parts[{i}]: a {kind or 'empty'} part; this agent takes text and data parts"
            )
    text = "\n".join(texts)
    if not text.strip():
        raise _invalid("the message has no text", "message.parts")
    return text


def decision_data(message: Any) -> tuple[bool, str, str | None] | None:
    """The decision a data part ``{"approved": bool, "note": str, "toolUseId": str}`` of the
    message says, if one does. ``toolUseId`` (the one the task's status message gives): the held
    call this decides, so a decision sent for a call decided meanwhile never decides the next
    one (refused naming ``toolUseId``); without it, the call held when it first lands (``api/a2a_server``
    binds the request to it: a retry decides nothing else)."""
    from google.protobuf.json_format import MessageToDict

    for part in message.parts:
        if part.WhichOneof("content") == "data":
            data = MessageToDict(part.data)
            if isinstance(data, dict) and isinstance(data.get("approved"), bool):
                note, use_id = data.get("note", ""), data.get("toolUseId")
                if use_id is not None and not (isinstance(use_id, str) and 0 < len(use_id) <= MAX_TOOL_USE_ID_CHARS):
                    raise _invalid(f"the held call's id (a string of 1 to {MAX_TOOL_USE_ID_CHARS:,} characters, "
                                   "as the task's status message gives it)", "toolUseId")  # fmt: skip
                note = note if isinstance(note, str) else ""
                return bool(data["approved"]), _held_to_a_note(note, "note"), use_id
    return None


def decision(text: str) -> tuple[bool, str, None]:
    """A text message to a task paused for approval, read as the decision: text starting with
    ``approve`` (a note may follow); any other text rejects the request with the message as its
    note, so the agent reads what the person said instead. Nothing but an explicit approval
    approves. Text names no call: it decides the call held when it first lands (``api/a2a_server``
    binds the request, its message id and text, to it: a retry decides nothing else)."""
    word, _, rest = text.strip().partition(" ")
    verb = word.strip(".,!:").lower()
    if verb in APPROVE_WORDS:
        return True, _held_to_a_note(rest.strip(), "message.parts"), None
    if verb in REJECT_WORDS:
        return False, _held_to_a_note(rest.strip(), "message.parts"), None
    return False, _held_to_a_note(text, "message.parts"), None


def _held_to_a_note(note: str, field: str) -> str:
    """``note`` if it holds at most ``MAX_NOTE_CHARS``, as a decision's note does by every door
    (``POST /tasks/{id}/approve``, MCP's answer), whatever word the message starts with; else
    invalid params naming ``field``, nothing decided."""
    if len(note) > MAX_NOTE_CHARS:
        raise _invalid(f"{len(note):,} characters; a message that answers an approval (its note) holds at most "
                       f"{MAX_NOTE_CHARS:,}", field)  # fmt: skip
    return note
