"""What a checkpoint stores of a run that opened a credential: its workspace without the value.

A process of the run may have read an API's echo of a credential (the egress proxy adds it to
the process's plain http requests) and written it into a file, a file's name or a link's target.
None of that may reach the bucket (docs/ARCHITECTURE.md, invariant 15), nor, from there, the
files API or a later run's model.

The scrub is not a walk of its own: the checkpoint's scan (``core.workspace_disk.scan``) is
given a ``Scrub`` and applies it in the one walk that decides what is stored, through the
descriptors it hashes from (each component opened from its parent with ``O_NOFOLLOW``, however
long the path; a file or directory the process made unreadable given the worker's access back,
as for the hash). So every byte that is stored was scrubbed: a walk of its own, by path, would
skip what it could not open (a path past PATH_MAX, a ``chmod 000`` directory) while the scan
reads and stores it. Anything the scan cannot read refuses the checkpoint
(``WorkspaceUnscannable``); nothing is skipped.

- **File content** is read a window at a time (``OVERLAP`` bytes of the one before kept, more
  than the longest spelling in any encoding) as the redactor reads a fetched body: as bytes
  (UTF-8, any ASCII-compatible charset) and as UTF-16 and UTF-32 of either byte order at any
  offset (``Redactor.holds``; a file's NULs cost one translation unless its bytes have those
  encodings' shape). A file that holds a value is rewritten in place, the value redacted in the
  encoding it was found in, and hashed as rewritten.
- **Refused** (``WorkspaceHoldsCredential``): an entry whose path or link target holds a value,
  and a file over ``MAX_REWRITE_BYTES`` that holds one (rewriting it would hold it whole in the
  worker's memory). Refusing rather than renaming keeps both promises: the turn's changes are
  undone to the last committed step, all of whose files are there (a committed step's files are
  never lost), and nothing holding the value is stored or shown (the refusal names the entry
  redacted). A rename the model did not make could take another entry's name (two names that
  differ only in the value redact alike) and would change what a link points at, so the
  workspace would silently stop being what the process left; the model is told instead, and can
  redo the turn without the value in a name.

Only what the scan reads is scrubbed: a file whose size, mtime, ctime and inode are what this
run's last scan saw is not read again (``ScanCache``). Its content was fixed before that scan,
which either scrubbed it or ran before this run opened any credential or read any secret, when
no process of the run could have had a value to write: a value reaches a process only through
an echo of a request the run made with it, after the run's hold had it. A cached signature that is wrong
cannot store unscrubbed bytes either: the upload checks the content against the scanned hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from agentq.core.tools.fetch import LONGEST_READ
from agentq.core.workspace import Manifest, WorkspaceHoldsCredential
from agentq.observe.redaction import Hold, Redactor, current

OVERLAP = LONGEST_READ  # bytes of a window kept for the next: a spelling across two is whole in one
MAX_REWRITE_BYTES = 16 * 1024 * 1024  # a file holding a value larger than this is refused, not rewritten


@dataclass(frozen=True)
class Scrub:
    """The values of the run it is made in (``observe.redaction.current``: the run's own hold,
    never another run's values, which could be any tenant's ordinary words), applied by the
    checkpoint's scan (see the module's docstring)."""

    redactor: Hold | Redactor = field(default_factory=current)

    def holds(self, data: bytes) -> bool:
        return self.redactor.holds(data)

    def cleaned(self, data: bytes) -> bytes:
        return self.redactor.redact_encoded(data)

    def shown(self, path: str) -> str:
        """``path`` as a message may name it."""
        return self.redactor.redact(path)

    def too_large(self, path: str, size: int) -> WorkspaceHoldsCredential:
        return WorkspaceHoldsCredential(
            f"{self.shown(path)!r} holds a credential's value and is {size} bytes, over the {MAX_REWRITE_BYTES} "
            "rewritten to redact it: remove the value or the file"
        )

    def check(self, manifest: Manifest) -> None:
        """Refuse ``manifest`` if a path or link target holds a value, as text (what the files
        API and ``list_files`` show) or in the manifest's own bytes (JSON, what the bucket holds)."""
        names = "\0".join(f"{e.path}\0{e.digest if e.kind == 'l' else ''}" for e in manifest.entries)
        if self.shown(names) == names and not self.redactor.holds(manifest.to_bytes()):
            return
        for e in manifest.entries:
            row = json.dumps([e.path, e.kind, e.mode, e.size, e.digest], separators=(",", ":")).encode()
            target = e.digest if e.kind == "l" else ""
            if self.shown(e.path) != e.path or self.shown(target) != target or self.redactor.holds(row):
                what = "its link target" if self.shown(e.path) == e.path and e.kind == "l" else "its path"
                raise WorkspaceHoldsCredential(
                    f"{self.shown(e.path)!r}: {what} holds a credential's value, which is never stored: "
                    "rename or remove it"
                )
        raise WorkspaceHoldsCredential("the workspace's listing holds a credential's value, which is never stored")
