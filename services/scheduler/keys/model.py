"""API keys and what a key permits (pure).

A key is ``sk-ts-`` followed by 43 URL-safe characters (32 random bytes from
:mod:`secrets`). Only its SHA-256 is stored, with a short visible prefix for listing: the
secret has 256 bits of entropy, so an unsalted fast hash cannot be reversed by guessing
(a slow password hash protects low-entropy secrets, which these are not).

Once keys are on, the request's tenant and SLO class come from its key
(:func:`resolve`): a tenant or class the request names must be the key's (else 403, the
request is refused rather than silently re-labelled, so a client bug shows), a request
naming no class gets the default class when the key permits it, else the key's first.
The prefix-cache namespace is the key's tenant joined with the request's own
``cache_salt`` (:func:`tenant_salt`): one tenant can neither hit nor probe another's
cached prefixes, whatever salt it sends.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "KEY_PREFIX",
    "ApiKey",
    "Denied",
    "Grant",
    "bearer_token",
    "check_tenant_name",
    "hash_key",
    "looks_like_key",
    "new_key",
    "resolve",
    "tenant_salt",
]

KEY_PREFIX = "sk-ts-"
_SECRET_BYTES = 32
_VISIBLE = len(KEY_PREFIX) + 6  # "sk-ts-AbCdEf": enough to tell keys apart in a list
_KEY = re.compile(r"^sk-ts-[A-Za-z0-9_-]{43}$")
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SALT_SEP = ":"  # never in a tenant name (check_tenant_name), so salts cannot collide


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as stored (never the secret). ``slo_classes`` empty = every class;
    ``rpm``/``tpm`` None = no limit; ``revoked_at`` None = live (wall seconds)."""

    key_id: str
    prefix: str
    tenant: str
    slo_classes: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    name: str = ""
    created_at: float = 0.0
    revoked_at: float | None = None

    @property
    def live(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class Grant:
    """What one request may do: its tenant, class and prefix-cache salt."""

    tenant: str
    slo_class: str
    cache_salt: str


@dataclass(frozen=True, slots=True)
class Denied:
    """A 403: ``param`` names the field the request set beyond its key."""

    message: str
    param: str


def new_key() -> tuple[str, str]:
    """A fresh (secret key, visible prefix)."""
    key = KEY_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
    return key, key[:_VISIBLE]


def hash_key(key: str) -> bytes:
    """SHA-256 of the whole key: what is stored and looked up."""
    return hashlib.sha256(key.encode()).digest()


def looks_like_key(key: str) -> bool:
    """Well-formed (``sk-ts-`` + 43 URL-safe characters); a cheap filter before any lookup."""
    return bool(_KEY.match(key))


def bearer_token(authorization: str | None) -> str:
    """The token of ``Authorization: Bearer TOKEN`` ('' when absent or another scheme)."""
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def check_tenant_name(tenant: str) -> str:
    """``tenant`` if it is 1-64 of ``[A-Za-z0-9_.-]`` starting alphanumeric; ValueError
    otherwise (no ``:``, so :func:`tenant_salt` is unambiguous)."""
    if not _TENANT.match(tenant):
        raise ValueError(
            f"tenant {tenant!r}: 1-64 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return tenant


def tenant_salt(tenant: str, cache_salt: str) -> str:
    """The prefix-cache namespace of a keyed request: ``tenant:cache_salt``."""
    return f"{tenant}{SALT_SEP}{cache_salt}"


def resolve(
    key: ApiKey,
    *,
    tenant: str,
    slo_class: str,
    cache_salt: str,
    default_class: str,
    classes: Sequence[str],
) -> Grant | Denied:
    """The request's grant under ``key``, or why it is refused. ``tenant``/``slo_class``:
    what the request named ('' = nothing); ``classes``: every class, highest first (the
    key's own order decides its fallback class)."""
    if tenant and tenant != key.tenant:
        return Denied(f"this API key is for tenant {key.tenant!r}, not {tenant!r}", "tenant")
    allowed = key.slo_classes or tuple(classes) or (default_class,)
    if slo_class:
        if slo_class not in allowed:
            return Denied(
                f"this API key may not use SLO class {slo_class!r} (allowed: {list(allowed)})",
                "slo_class",
            )
        cls = slo_class
    else:
        cls = default_class if default_class in allowed else allowed[0]
    return Grant(key.tenant, cls, tenant_salt(key.tenant, cache_salt))
