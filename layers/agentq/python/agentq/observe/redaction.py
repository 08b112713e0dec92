"""Redaction: a credential's value, in any spelling it is likely to take, never leaves in text.

Every credential a worker decrypts (``core.engine._credentials``) is added here, held by the run
that opened it (``Hold``) until the run ends, and then kept among the most recent ``MAX_VALUES``
spellings no run holds: another run, another tenant's, adding thousands of values never evicts
a value a live run may still send. What the process writes out passes
through ``redact`` first: a tool's result and error whole, before anything cuts it (the
registry, ``core.tools._core``; a fetched body, ``core.tools.fetch``; a remote agent's text), and
every tool outcome as it is made (``core.models.steps.ToolOutcome``), hence before any item,
event, trace, span or callback is made of it; every log line, through ``RedactingFilter`` on
the process's handlers (``observe.logs``); and, in a run that opened a credential, every
workspace file and name a checkpoint stores (``core.workspace_scrub``).

Whose values: a run's results and files are redacted of the values *that run* opened (its
``Hold``, ``run_scope``/``current``), its log lines of every value the process holds. The worker
is shared by every tenant's runs and a value is whatever its writer chose (an end user may store
``function``): by the process's set, one user's value would rewrite another tenant's results
and files wherever they hold it. A run's output cannot hold a value it did not open (its tools
reach no other, and each is held before it is sent); a log redacted of too much loses nothing.
The deployment's secrets (``core.secrets``) are the operator's, sent for any run (a client a
tool keeps across runs sends one read in another): every run's output is redacted of each one
the process has read, from the moment it is read (``keep_secret``), as every log line is; so
are the providers' own keys, from the moment a provider is made (``core.providers.keys``). Code
in no run's context that knows its values (the egress proxy's threads) redacts by a ``Values``.

The spellings: the value itself, percent-encoded (``quote`` with and without ``/`` safe,
``quote_plus``, hex in either case), JSON-escaped (``\\/`` as PHP writes it, every character as
``\\u`` as .NET may), hex (either case), HTML entities, and base64 (standard and URL-safe; padding
is never part of a core) at each of the three alignments a value can have inside a longer
encoded text (the middle characters that do not depend on what surrounds it: an echo of a whole
``Authorization`` header, base64-encoded, still loses the value). Bytes are read as UTF-8 (and so
any charset ASCII is ASCII in); a fetched body and a workspace file also as UTF-16 and UTF-32
(``redact_encoded``), which the body's charset, its byte order mark or the tool that reads it may
decode it as. A value shorter than ``MIN_CHARS`` is never redacted (``core.vault`` refuses it as
a credential): ordinary text holds such strings everywhere.

The spellings are found by an index (``_Index``), not by one pattern of them all: adding a value
costs a fixed number of dictionary updates whatever the redactor holds (a pattern recompiled on
each add cost seconds once it held thousands, under the lock), and reading a text costs about
the same however many values are held. Where spellings overlap in a text, all they cover is
redacted, as one.
"""

from __future__ import annotations

import base64
import html
import json
import re
import threading
import urllib.parse
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from agentq.observe.redaction_bytes import WIDE_ENCODINGS, byte_offsets, chosen, fitted, replaced

MIN_CHARS = 8
MAX_VALUES = 4096
REDACTED = "[redacted credential]"


def _escaped(value: str, form: str) -> str:
    """``value`` with every character but a letter or a digit written as ``form`` of its code."""
    return "".join(c if c.isascii() and c.isalnum() else form.format(ord(c)) for c in value)


def spellings(value: str) -> set[str]:
    """The texts that carry ``value``: itself, percent-encoded (``/`` kept or not, ``+`` for a
    space or not, upper- or lowercase hex), JSON-escaped (``\\/`` too, and every other character
    as ``\\u``), hex, HTML entities (named, decimal, hex), base64 cores."""
    raw = value.encode("utf-8")
    percent = {
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),  # the default leaves "/" alone
        urllib.parse.quote_plus(value),
        urllib.parse.quote_plus(value, safe="/"),
    }
    percent |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), p) for p in percent}
    escaped = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    escaped |= {e.replace("/", "\\/") for e in escaped}  # PHP's json_encode
    out = {value, *percent, *escaped, raw.hex(), raw.hex().upper(), html.escape(value)}
    out |= {_escaped(value, form) for form in ("\\u{:04x}", "\\u{:04X}", "&#{};", "&#x{:x};", "&#x{:X};")}
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * shift + raw).decode().rstrip("=")
            start = -(-shift * 8 // 6)  # the first character that depends on the value alone
            end = (shift + len(raw)) * 8 // 6  # the last whole character of it
            out.add(encoded[start:end])
    return {s for s in out if len(s) >= MIN_CHARS}


GRAM = 5  # the texts are read at every STEP-th character, GRAM characters at a time: a
STEP = 4  # spelling of MIN_CHARS (>= STEP + GRAM - 1) or more has one of its grams at such a place
_GRAMS = re.compile(rf"(?=(.{{{GRAM}}})).{{{STEP}}}", re.DOTALL)
# A spelling whose every character is in U+0020..U+00FF (a value the vault accepts has no control
# character; one past Latin-1 makes the index read every view) is, in UTF-16, MIN_CHARS or more
# units of one non-NUL byte and a NUL, and in UTF-32 of one non-NUL byte and three NULs, at any
# offset and byte order. ``_SHAPES`` maps bytes to "0" (NUL), "c" (a byte such a character may
# be) and "x"; bytes whose shape lacks ``_UNITS[width]`` hold no such spelling in that width's
# encodings, so they are not decoded in them: a binary file's NULs (a workspace's, a body's) cost
# one translation, not twelve decodes.
_SHAPES = bytes.maketrans(bytes(range(256)), b"0" + b"x" * 31 + b"c" * 224)
_UNITS = {2: b"c0" * (MIN_CHARS - 1) + b"c", 4: b"c000" * (MIN_CHARS - 1) + b"c"}


def _shaped(word: str) -> bool:
    return min(word) >= " " and max(word) <= "\xff"


class _Index:
    """The spellings, found in a text without a pattern built of them all.

    Each spelling is filed under its ``GRAM``-character pieces at offsets ``0..STEP-1`` and under
    its first ``MIN_CHARS`` characters (its head) with its length. Adding or removing one is a
    fixed number of dictionary updates (``work`` counts them), whatever the index holds; finding
    them reads the text's grams at every ``STEP``-th character (one C-level pass, then a set
    test), and only where a gram is known checks the heads and lengths filed there. Readers take
    no lock: a writer replaces the small dictionaries and lists it changes, never mutates them.
    """

    def __init__(self) -> None:
        self.words: set[str] = set()
        self.grams: dict[str, tuple[int, ...]] = {}  # gram -> how many spellings hold it at each offset
        self.heads: dict[str, dict[int, int]] = {}  # head -> {length: how many spellings}
        self.work = 0
        self.wide = 0  # spellings with a character past U+00FF: in UTF-16, maybe no NUL byte
        self.unshaped = 0  # spellings with a character outside U+0020..U+00FF (see _SHAPES)

    def add(self, word: str) -> None:
        if word in self.words:
            return
        for j in range(STEP):
            gram = word[j : j + GRAM]
            counts = list(self.grams.get(gram, (0,) * STEP))
            counts[j] += 1
            self.grams[gram] = tuple(counts)
        lengths = dict(self.heads.get(word[:MIN_CHARS], {}))
        lengths[len(word)] = lengths.get(len(word), 0) + 1
        self.heads[word[:MIN_CHARS]] = lengths
        self.words.add(word)
        self.wide += max(word) > "\xff"
        self.unshaped += not _shaped(word)
        self.work += STEP + 1

    def remove(self, word: str) -> None:
        if word not in self.words:
            return
        self.words.discard(word)
        self.wide -= max(word) > "\xff"
        self.unshaped -= not _shaped(word)
        for j in range(STEP):
            gram = word[j : j + GRAM]
            counts = list(self.grams[gram])
            counts[j] -= 1
            if any(counts):
                self.grams[gram] = tuple(counts)
            else:
                del self.grams[gram]
        lengths = dict(self.heads[word[:MIN_CHARS]])
        lengths[len(word)] -= 1
        if not lengths[len(word)]:
            del lengths[len(word)]
        if lengths:
            self.heads[word[:MIN_CHARS]] = lengths
        else:
            del self.heads[word[:MIN_CHARS]]
        self.work += STEP + 1

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where spellings sit in ``text``, overlapping ones merged, in order."""
        grams, heads, words = self.grams, self.heads, self.words
        # A set no larger than the index, from the text's grams one at a time: a list of them all
        # (findall) was ~60 bytes a 4 characters of text, 250 MB at the peak for a 16 MB file.
        known = grams.keys() & (m[1] for m in _GRAMS.finditer(text))
        hits: list[tuple[int, int]] = []
        for gram in known:  # each place a known gram sits at a multiple of STEP: at most one a place
            at = text.find(gram)
            while at >= 0:
                if at % STEP == 0:
                    for j, count in enumerate(grams.get(gram, ())):
                        start = at - j
                        if not count or start < 0:
                            continue
                        for length in sorted(heads.get(text[start : start + MIN_CHARS], ()), reverse=True):
                            # the longest one starting here that fits (a slice past the end is shorter)
                            if start + length <= len(text) and text[start : start + length] in words:
                                hits.append((start, start + length))
                                break
                at = text.find(gram, at + 1)
        merged: list[tuple[int, int]] = []
        for start, end in sorted(hits):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    parts, at = [], 0
    for start, end in spans:
        parts += [text[at:start], REDACTED]
        at = end
    parts.append(text[at:])
    return "".join(parts)


def _forms(values: tuple[str, ...]) -> set[str]:
    """The spellings of ``values``; the bytes of a non-ASCII one, read a character a byte
    (``redact_bytes``), too."""
    out: set[str] = set()
    for value in values:
        if len(value) >= MIN_CHARS:
            for spelling in spellings(value):
                out |= {spelling, spelling.encode("utf-8").decode("latin-1")}
    return out


class _Finder:
    """Redacts the spellings its index holds: a ``Redactor``'s (the process's), or a ``Hold``'s
    (one run's own)."""

    _index: _Index

    @property
    def empty(self) -> bool:
        return not self._index.words

    def redact(self, text: str) -> str:
        if not text or self.empty:
            return text
        spans = self._index.spans(text)
        return _cut(text, spans) if spans else text

    def redact_bytes(self, data: bytes) -> bytes:
        if not data or self.empty:
            return data
        text = data.decode("latin-1")
        spans = self._index.spans(text)
        return _cut(text, spans).encode("latin-1") if spans else data

    def redact_encoded(self, data: bytes, upto: int | None = None) -> bytes:
        """``data`` redacted as ``redact_bytes`` reads it (UTF-8, or any charset ASCII's bytes
        are ASCII in), and as UTF-16 and UTF-32 of either byte order from any byte on (what a body
        is in, whatever charset it names: a byte order mark, or a tool, may decide), each span
        replaced by REDACTED in the encoding it was found in, so the text around it decodes as
        before. ``upto``: only what the first ``upto`` bytes became, a redaction that holds byte
        ``upto`` left out whole (``core.tools.fetch``: the end of a cut read may be in a value)."""
        end = len(data) if upto is None else max(0, min(upto, len(data)))
        if not data or self.empty:
            return data[:end]
        return replaced(data, chosen(self._encoded_spans(data)), end)

    def holds(self, data: bytes) -> bool:
        """Whether ``data`` holds a spelling in any view ``redact_encoded`` reads (the workspace's
        scrub, ``core.workspace_scrub``: a file is rewritten only if it does)."""
        return bool(data) and not self.empty and bool(self._encoded_spans(data))

    def _encoded_spans(self, data: bytes) -> list[tuple[int, int, bytes, int, bool]]:
        """(start, end, REDACTED in the view's encoding, its bytes a unit, whether the view starts
        at byte 0) of every spelling in every view. Every character is a unit with a NUL byte in
        UTF-32, and so is one up to U+00FF in UTF-16: bytes without a NUL are read in neither,
        unless a spelling has a character past U+00FF; bytes with one, only in a width whose run
        of units (``_UNITS``) their shape holds, unless a spelling has a character ``_SHAPES``
        does not cover."""
        mark = REDACTED.encode()
        found = [(start, end, mark, 1, True) for start, end in self._index.spans(data.decode("latin-1"))]
        nul = b"\x00" in data
        shape = data.translate(_SHAPES) if nul and not self._index.unshaped else None
        for codec, width in WIDE_ENCODINGS:
            if not nul and (width == 4 or not self._index.wide):
                continue
            if shape is not None and _UNITS[width] not in shape:
                continue
            for shift in range(width):
                whole = shift + (len(data) - shift) // width * width
                text = data[shift:whole].decode(codec, "surrogatepass" if width == 2 else "replace")
                spans = self._index.spans(text)
                if spans:
                    at, mark = byte_offsets(text, width), REDACTED.encode(codec)
                    found += [(shift + at(start), shift + at(end), mark, width, shift == 0) for start, end in spans]
        return found


class Hold(_Finder):
    """The values one run opened (``core.engine._credentials``): redacted by the process, and
    never evicted, from ``add`` until ``release``, however many values other runs add meanwhile.
    A hold also redacts by itself, of its values only (``redact``...), what its run makes: the
    run's results and files are redacted of its own values, never of another run's (see
    ``current``); it keeps them for that after its release."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self.forms: set[str] = set()  # pinned in the redactor, until the release
        self.values: set[str] = set()  # added by its run (a credential opened, a secret read), till the release
        self._index = _Index()  # every value ever added, and every kept one: the run's own redaction

    def add(self, *values: str) -> None:
        self._redactor._pin(self, values)

    def release(self) -> None:
        """The run is over: its values join the recent ones, evicted in their turn."""
        self._redactor._unpin(self)

    def release_later(self) -> None:
        """``release`` at the redactor's next write, for a finalizer: the garbage collector runs
        one wherever an allocation triggers it, inside the redactor's own locked writes too, where
        taking the lock again would wait on this very thread for ever."""
        self._redactor._released.append(self)


class Values(_Finder):
    """Exactly ``values``' spellings, adding nothing to the process's set: for code in no run's
    context that knows which values it must not pass (the egress proxy's threads)."""

    def __init__(self, *values: str) -> None:
        self._index = _Index()
        for form in _forms(values):
            self._index.add(form)

    def redact_same_length(self, data: bytes) -> bytes:
        """``redact_encoded``, each mark as long as what it replaces (git's pkt-lines keep framing)."""
        if not data or self.empty:
            return data
        return replaced(data, fitted(chosen(self._encoded_spans(data)), REDACTED), len(data))


class Redactor(_Finder):
    """The values this process must not write out, and the index that finds them: every value a
    live ``Hold`` has, and the most recent ``MAX_VALUES`` spellings besides (memory stays bounded
    by what live runs hold)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: OrderedDict[str, None] = OrderedDict()  # recent, evicted oldest first
        self._pins: dict[str, int] = {}  # spelling -> how many live holds have it (and 1 if kept)
        self._kept: set[str] = set()  # the deployment's secrets read (``keep``)
        self._kept_forms: set[str] = set()
        self._live: weakref.WeakSet[Hold] = weakref.WeakSet()  # holds not yet released
        self._released: deque[Hold] = deque()  # released by a finalizer, unpinned at the next write
        self._index = _Index()

    @property
    def work(self) -> int:
        """Dictionary updates spent filing and unfiling spellings (the tests bound it)."""
        return self._index.work

    @property
    def held(self) -> int:
        """How many spellings live holds keep."""
        return len(self._pins)

    def hold(self) -> Hold:
        """A run's hold, which redacts the values kept (``keep``) beside those its run adds."""
        hold = Hold(self)
        with self._writing():
            for form in self._kept_forms:
                hold._index.add(form)
            self._live.add(hold)
        return hold

    def keep(self, *values: str) -> None:
        """The deployment's secrets (few; none that ordinary text holds, ``core.secrets``), sent for any
        run: redacted from every log line and every live and later run's output, never evicted."""
        if all(v in self._kept for v in values):  # the common case, each read: no lock, no spellings
            return
        with self._writing():
            fresh = tuple(v for v in values if v not in self._kept)
            self._kept.update(fresh)
            forms = _forms(fresh) - self._kept_forms
            self._kept_forms |= forms
            for form in forms:
                self._pins[form] = self._pins.get(form, 0) + 1  # never unpinned
                self._values.pop(form, None)
                self._index.add(form)
            for hold in list(self._live):
                for form in forms:
                    hold._index.add(form)

    def add(self, *values: str) -> None:
        """Values no run holds (kept while they are among the most recent ``MAX_VALUES``)."""
        with self._writing():
            for form in _forms(values):
                self._values[form] = None
                self._values.move_to_end(form)
                self._index.add(form)
            self._evict()

    def _pin(self, hold: Hold, values: tuple[str, ...]) -> None:
        if all(v in hold.values for v in values):  # held already (a secret read on each call)
            return
        with self._writing():
            values = tuple(v for v in values if v not in hold.values)
            hold.values.update(values)
            forms = _forms(values)
            for form in forms:
                hold._index.add(form)  # a form it has is not filed again
            for form in forms - hold.forms:
                hold.forms.add(form)
                self._pins[form] = self._pins.get(form, 0) + 1
                self._index.add(form)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The lock, and the holds finalizers released meanwhile unpinned first (``release_later``)."""
        with self._lock:
            while self._released:
                self._unpin_locked(self._released.popleft())
            yield

    def _unpin(self, hold: Hold) -> None:
        with self._writing():
            self._unpin_locked(hold)

    def _unpin_locked(self, hold: Hold) -> None:
        for form in hold.forms:
            left = self._pins.pop(form, 1) - 1
            if left:  # another live run holds it still: no recent slot for it yet
                self._pins[form] = left
                continue
            self._values[form] = None
            self._values.move_to_end(form)
        hold.forms, hold.values = set(), set()
        self._live.discard(hold)
        self._evict()

    def _evict(self) -> None:
        while len(self._values) > MAX_VALUES:
            form, _ = self._values.popitem(last=False)
            if form not in self._pins:  # a live run's value stays, whatever others add
                self._index.remove(form)

    def clear(self) -> None:
        with self._writing():
            self._values.clear()
            self._pins.clear()
            self._kept.clear()
            self._kept_forms.clear()
            self._index = _Index()


REDACTOR = Redactor()
_run: ContextVar[Hold | None] = ContextVar("agentq_redaction_run", default=None)


@contextmanager
def run_scope() -> Iterator[Hold]:
    """The run in this block (``Engine.run``; the threads it starts copy its context): the values
    its credentials open go into the hold it yields (``core.engine._credentials``), released when
    it ends, and ``current`` redacts by that hold."""
    hold = REDACTOR.hold()
    token = _run.set(hold)
    try:
        yield hold
    finally:
        _run.reset(token)
        hold.release()


def run_hold() -> Hold | None:
    """The hold of the run this code runs in, if any (``run_scope``)."""
    return _run.get()


def keep_secret(value: str) -> None:
    """A deployment secret just read (``core.secrets``), in any thread, run or none: kept
    (``Redactor.keep``), and added to the reading run's hold, if any (its files may hold it)."""
    REDACTOR.keep(value)
    hold = _run.get()
    if hold is not None:
        hold.add(value)


def current() -> Hold | Redactor:
    """What a run's own output is redacted by: its own values, or, outside a run, every value of
    the process (too many at worst: never too few). Why not always the process's set: the
    module's "Whose values"."""
    hold = _run.get()
    return REDACTOR if hold is None else hold


def redact(text: str) -> str:
    return current().redact(text)


def redact_encoded(data: bytes, upto: int | None = None) -> bytes:
    """``Redactor.redact_encoded`` by ``current()``."""
    return current().redact_encoded(data, upto)
