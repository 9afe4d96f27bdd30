"""Least privilege in the state stores (pure): one Redis ACL user and one Postgres role per
service, each allowed only what that service touches.

Redis (ACLs of Redis 6.2: key patterns, no read/write split per pattern): user
``tideserve-<svc>`` may run every command but the ``@dangerous`` ones (no KEYS, FLUSH*,
CONFIG, DEBUG, ACL, ...) and only on the streams and keys in :data:`REDIS_KEYS` under the
stack's stream prefix; no pub/sub channels. ``default`` keeps full access behind the admin
password (for provisioning). Streams that carry traffic between services (``kv``,
``membership``, ``requests``, ...) are necessarily shared by their producer and consumers.

Postgres: role ``tideserve_<svc>`` (LOGIN, no superuser, no CREATEDB/CREATEROLE) owns schema
``<svc>`` and everything in it, and has no privilege on any other service's schema (nor
CREATE on ``public``); every service migrates its own schema with its own role.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from urllib.parse import quote, urlsplit, urlunsplit

__all__ = [
    "ENGINE_USER",
    "REDIS_KEYS",
    "SERVICES",
    "pg_role",
    "postgres_setup_sql",
    "redis_acl_file",
    "redis_user",
    "redis_users",
    "with_credentials",
    "without_credentials",
]

SERVICES = ("scheduler", "kvmeta", "autoscaler", "telemetry")
ENGINE_USER = "engine"
"""The ACL user of simulated engines and the KV-event bridge (they publish KV events and
load snapshots and read resync requests)."""

REDIS_KEYS: Mapping[str, tuple[str, ...]] = {
    # suffix patterns under "{prefix}:"; "x*" also covers the dead letters "x:dead"
    "scheduler": (
        "kv:*",
        "load:*",
        "resync:*",
        "membership*",
        "requests*",
        "routed:*",
        "inflight:*",
        "rl:*",  # per-tenant rate-limit windows (scheduler/keys/counters.py)
    ),
    "kvmeta": ("kv:*", "load:*", "resync:*", "membership*"),
    "telemetry": ("requests*", "load:*", "membership*"),
    "autoscaler": ("membership*",),
    ENGINE_USER: ("kv:*", "load:*", "resync:*"),
}


def redis_user(service: str) -> str:
    return f"tideserve-{service}"


def pg_role(service: str) -> str:
    return f"tideserve_{service}"


def _sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def redis_users(prefix: str, passwords: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """``(user, ACL rules)`` of each user in ``passwords`` (a key of :data:`REDIS_KEYS` ->
    its password), as ``ACL SETUSER user *rules`` takes them; passwords as SHA-256 only."""
    out = []
    for who, patterns in REDIS_KEYS.items():
        if who not in passwords:
            continue
        rules = ["reset", "on", f"#{_sha(passwords[who])}"]
        rules += [f"~{prefix}:{p}" for p in patterns]
        rules += ["resetchannels", "+@all", "-@dangerous"]
        out.append((redis_user(who), rules))
    return out


def redis_acl_file(prefix: str, passwords: Mapping[str, str], admin_password: str) -> str:
    """An ACL file for ``redis-server --aclfile``: :func:`redis_users` plus ``default``
    (everything, behind ``admin_password``)."""
    lines = [f"user default on #{_sha(admin_password)} ~* &* +@all"]
    lines += [f"user {user} {' '.join(rules)}" for user, rules in redis_users(prefix, passwords)]
    return "\n".join(lines) + "\n"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"not a plain SQL name: {name!r}")
    return f'"{name}"'


def postgres_setup_sql(
    passwords: Mapping[str, str], database: str, services: Sequence[str] = SERVICES
) -> list[str]:
    """Statements a superuser runs (idempotent) before the services migrate: each role,
    its schema owned by it (objects an earlier run created as another role are handed
    over), and no CREATE on ``public``."""
    db = _ident(database)
    out = [
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
        f"REVOKE CREATE, TEMPORARY ON DATABASE {db} FROM PUBLIC",
    ]
    for svc in services:
        role, schema, pw = _ident(pg_role(svc)), _ident(svc), _literal(passwords[svc])
        out.append(
            "DO $$BEGIN "
            f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {_literal(pg_role(svc))}) "
            f"THEN CREATE ROLE {role}; END IF; END$$"
        )
        out.append(
            f"ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD {pw}"
        )
        out.append(f"GRANT CONNECT ON DATABASE {db} TO {role}")
        out.append(f"CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {role}")
        out.append(f"ALTER SCHEMA {schema} OWNER TO {role}")
        out.append(_hand_over(svc))
    return out


def _hand_over(svc: str) -> str:
    """Every table, view, free-standing sequence and type of schema ``svc`` to its role."""
    s, r = _literal(svc), _literal(pg_role(svc))
    return (
        "DO $$DECLARE o record; BEGIN "
        "FOR o IN SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' "
        "WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END AS kind, c.relname AS name "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = {s} AND c.relkind IN ('r', 'p', 'v', 'm', 'S') "
        "AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.objid = c.oid "
        "AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) "
        "LOOP EXECUTE format('ALTER %s %I.%I OWNER TO %I', o.kind, "
        f"{s}, o.name, {r}); END LOOP; "
        "FOR o IN SELECT t.typname AS name FROM pg_type t "
        "JOIN pg_namespace n ON n.oid = t.typnamespace "
        f"WHERE n.nspname = {s} AND t.typtype IN ('e', 'd') "
        f"LOOP EXECUTE format('ALTER TYPE %I.%I OWNER TO %I', {s}, o.name, {r}); END LOOP; "
        "END$$"
    )


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` (redis:// or postgresql://) with ``user:password`` as its credentials."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def without_credentials(url: str) -> str:
    """``url`` with no user or password (safe to record)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
