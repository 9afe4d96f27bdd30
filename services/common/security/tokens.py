"""Bearer tokens: generated, stored hashed, compared in constant time.

A tokens file has one token per line, ``NAME ROLE sha256:HEX`` (``#`` comments and blank
lines ignored), e.g. ``stack-operator operator sha256:9f86d0...``. Only the SHA-256 of a
token is stored: tokens are 256-bit random strings (:func:`new_token`), so a plain hash is
as good as a slow one. :func:`lookup` hashes the presented token and compares it with every
entry using ``hmac.compare_digest`` (no early exit). :class:`TokenFile` re-reads the file
when it changes (checked at most every ``recheck_s``); a file that no longer parses keeps
the previous entries.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.security.access import Role

__all__ = [
    "TokenEntry",
    "TokenFile",
    "file_stamp",
    "format_entry",
    "hash_token",
    "lookup",
    "new_token",
    "parse_tokens",
    "read_token",
]

log = logging.getLogger(__name__)
_SCHEME = "sha256:"


def new_token() -> str:
    """A fresh random token (43 url-safe characters, 256 bits)."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """``sha256:<hex>`` of ``token`` (what a tokens file stores)."""
    return _SCHEME + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: Role
    digest: bytes


def format_entry(name: str, role: Role, token: str) -> str:
    """The tokens-file line of ``token``."""
    return f"{name} {role.label} {hash_token(token)}"


def parse_tokens(text: str, source: str = "tokens file") -> tuple[TokenEntry, ...]:
    """Entries of a tokens file; ValueError naming the line of the first bad one."""
    out = []
    names: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(_SCHEME):
            raise ValueError(f"{source} line {n}: expected 'NAME ROLE sha256:HEX'")
        name, role, digest = parts
        try:
            raw_digest = bytes.fromhex(digest[len(_SCHEME) :])
        except ValueError:
            raise ValueError(f"{source} line {n}: the digest is not hex") from None
        if len(raw_digest) != 32:
            raise ValueError(f"{source} line {n}: a sha256 digest has 64 hex digits")
        if name in names:
            raise ValueError(f"{source} line {n}: token name {name!r} twice")
        names.add(name)
        try:
            out.append(TokenEntry(name, Role.parse(role), raw_digest))
        except ValueError as err:
            raise ValueError(f"{source} line {n}: {err}") from None
    return tuple(out)


def lookup(entries: Sequence[TokenEntry], token: str) -> TokenEntry | None:
    """The entry of ``token``, comparing against every entry in constant time."""
    digest = hashlib.sha256(token.encode()).digest()
    found: TokenEntry | None = None
    for entry in entries:
        if hmac.compare_digest(entry.digest, digest):
            found = entry
    return found


def file_stamp(path: Path) -> tuple[int, int, int]:
    """(inode, size, mtime) of ``path``, (-1, -1, -1) when it cannot be read: a changed
    stamp means the file was replaced or rewritten."""
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_token(path: Path) -> str:
    """The token in ``path`` (its first non-blank line); ValueError when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"auth.token_file {path}: {err.strerror or err}") from err
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise ValueError(f"auth.token_file {path} holds no token")


class TokenFile:
    """A tokens file, re-read when it changes. Raises ValueError at construction when the
    file cannot be read or parsed (a startup error)."""

    def __init__(self, path: Path, clock: Callable[[], float], *, recheck_s: float = 1.0) -> None:
        self.path = path
        self._clock = clock
        self._recheck_s = recheck_s
        self._stamp = file_stamp(self.path)
        self.entries = self._load()
        self._checked = clock()

    def _load(self) -> tuple[TokenEntry, ...]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as err:
            raise ValueError(f"auth.tokens_file {self.path}: {err.strerror or err}") from err
        return parse_tokens(text, f"auth.tokens_file {self.path}")

    def current(self) -> tuple[TokenEntry, ...]:
        """The entries, re-read first when the file changed since the last check."""
        now = self._clock()
        if now - self._checked < self._recheck_s:
            return self.entries
        self._checked = now
        stamp = file_stamp(self.path)
        if stamp != self._stamp:
            try:
                self.entries = self._load()
            except ValueError as err:
                log.warning("tokens file changed but does not load; keeping the old one: %s", err)
            self._stamp = stamp
        return self.entries

    def role_of(self, token: str) -> TokenEntry | None:
        return lookup(self.current(), token)
