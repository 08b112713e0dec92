"""Envelope encryption of the vault's credentials: a data key per credential, itself kept only
wrapped, and AES-256-GCM (the ``cryptography`` package) with the credential's identity as
associated data.

Where the data key comes from and how it is wrapped is a ``DataKeys``:

- ``KmsDataKeys`` (AWS): ``kms.generate_data_key`` under the deployment's key, with an
  encryption context naming the tenant, the user and the credential; ``kms.decrypt`` with the
  same context unwraps it, so a ciphertext copied under another user's name does not open,
  and CloudTrail logs who unwrapped what. The API may only generate, the workers only decrypt
  (``infra``'s grants);
- ``LocalDataKeys`` (``agentq dev``, tests): a 32-byte key file (created 0600 on first use)
  wraps the data key with AES-GCM, the context as associated data.

``EnvelopeCipher`` seals and opens, and keeps unwrapped data keys for ``cache_seconds``
(default 300) so a credential used on every turn costs one KMS call per worker per five
minutes, not one per use (``bench/vault_cost.py`` measures both).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentq.core.vault import Sealed, VaultUnavailable, context_for

__all__ = ["EnvelopeCipher", "KmsDataKeys", "LocalDataKeys", "context_for"]

KMS_KEY_VARIABLE = "AGENTQ_VAULT_KMS_KEY"
KEY_FILE_VARIABLE = "AGENTQ_VAULT_KEY_FILE"
CACHE_SECONDS = 300.0
CACHE_ENTRIES = 1024


def _aad(context: dict[str, str]) -> bytes:
    return json.dumps(context, sort_keys=True, separators=(",", ":")).encode()


class DataKeys(Protocol):
    key_id: str

    def generate(self, context: dict[str, str]) -> tuple[bytes, bytes]:
        """A new data key: (plaintext, wrapped)."""

    def unwrap(self, wrapped: bytes, context: dict[str, str]) -> bytes: ...


# What ``os.link`` raises on a filesystem that has no hard links (some FUSE, SMB and vfat mounts).
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _create_exclusive(path: Path, key: bytes) -> None:
    """Create ``path`` (mode 0600) holding ``key``, on disk before this returns; FileExistsError
    if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
        out.flush()
        os.fsync(out.fileno())


class LocalDataKeys:
    """Data keys wrapped by a key file's 32-byte key (``agentq dev``)."""

    def __init__(self, master: bytes, key_id: str = "local") -> None:
        if len(master) != 32:
            raise VaultUnavailable("the vault key file must hold 32 bytes", field=KEY_FILE_VARIABLE)
        self._aead = AESGCM(master)
        self.key_id = key_id
        self.calls = 0

    @classmethod
    def from_file(cls, path: str | Path) -> LocalDataKeys:
        """The key in ``path``, made (32 random bytes, mode 0600) if the file does not exist.

        Several processes may start on a new path at once (``agentq dev``'s workers and API): the
        key is written whole to a file of this process's own, then linked to ``path``, which
        fails if another process linked its key first. So ``path`` never exists empty or half
        written, and every process reads the one key that won (an ``O_EXCL`` create followed by
        a write let a second process read the file in between: 0 bytes, and it exited)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            key = secrets.token_bytes(32)
            draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            try:
                _create_exclusive(draft, key)
                with contextlib.suppress(FileExistsError):  # another process's key won: every process reads it
                    try:
                        os.link(draft, path)
                    except OSError as exc:
                        if exc.errno not in _NO_HARD_LINKS:
                            raise
                        # A filesystem without hard links: created in place, a process reading
                        # between its create and its write finds it short (refused, naming the file).
                        _create_exclusive(path, key)
            finally:
                draft.unlink(missing_ok=True)
        master = path.read_bytes()
        return cls(master, key_id=f"file:{hashlib.sha256(master).hexdigest()[:12]}")

    def generate(self, context: dict[str, str]) -> tuple[bytes, bytes]:
        self.calls += 1
        key = AESGCM.generate_key(bit_length=256)
        nonce = secrets.token_bytes(12)
        return key, nonce + self._aead.encrypt(nonce, key, _aad(context))

    def unwrap(self, wrapped: bytes, context: dict[str, str]) -> bytes:
        self.calls += 1
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], _aad(context))
        except InvalidTag:
            raise VaultUnavailable("a credential's data key does not open under its owner's name") from None


class KmsDataKeys:
    """Data keys from AWS KMS: ``client`` is a KMS client (boto3 or botocore)."""

    def __init__(self, client: Any, key_id: str) -> None:
        self.client = client
        self.key_id = key_id
        self.calls = 0

    def generate(self, context: dict[str, str]) -> tuple[bytes, bytes]:
        self.calls += 1
        made = self.client.generate_data_key(KeyId=self.key_id, KeySpec="AES_256", EncryptionContext=context)
        return bytes(made["Plaintext"]), bytes(made["CiphertextBlob"])

    def unwrap(self, wrapped: bytes, context: dict[str, str]) -> bytes:
        self.calls += 1
        try:
            opened = self.client.decrypt(CiphertextBlob=wrapped, EncryptionContext=context, KeyId=self.key_id)
        except Exception as exc:  # botocore's ClientError, without importing botocore here
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            raise VaultUnavailable(f"KMS would not unwrap a credential's data key ({code})") from None
        return bytes(opened["Plaintext"])


class EnvelopeCipher:
    """Seal and open credentials; unwrapped data keys kept for ``cache_seconds``."""

    def __init__(self, keys: DataKeys, *, cache_seconds: float = CACHE_SECONDS) -> None:
        self.keys = keys
        self.cache_seconds = cache_seconds
        self._cache: OrderedDict[bytes, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def seal(self, secret: bytes, context: dict[str, str]) -> Sealed:
        key, wrapped = self.keys.generate(context)
        nonce = secrets.token_bytes(12)
        ciphertext = AESGCM(key).encrypt(nonce, secret, _aad(context))
        return Sealed(ciphertext=ciphertext, nonce=nonce, wrapped_key=wrapped, key_id=self.keys.key_id)

    def open(self, sealed: Sealed, context: dict[str, str]) -> bytes:
        key = self._data_key(sealed.wrapped_key, context)
        try:
            return AESGCM(key).decrypt(sealed.nonce, sealed.ciphertext, _aad(context))
        except InvalidTag:
            raise VaultUnavailable("a credential does not open under its owner's name") from None

    def _data_key(self, wrapped: bytes, context: dict[str, str]) -> bytes:
        slot = hashlib.sha256(wrapped + _aad(context)).digest()
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(slot)
            if cached is not None and cached[1] > now:
                self.hits += 1
                self._cache.move_to_end(slot)
                return cached[0]
        key = self.keys.unwrap(wrapped, context)
        with self._lock:
            self.misses += 1
            self._cache[slot] = (key, now + self.cache_seconds)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return key

    def forget(self) -> None:
        """Drop every cached data key (the bench's cold case)."""
        with self._lock:
            self._cache.clear()
