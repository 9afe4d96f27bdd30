"""The local stack's secrets and least-privilege wiring (``tideserve up``).

On first start ``<state_dir>/secrets/`` (mode 0700) gets, each file 0600:

- ``admin.token`` (role admin: the CLI and ``up`` itself) and ``service.token`` (role
  operator: what the services present to each other), and ``tokens``, the hashed tokens
  file every service checks calls against (services.common.security.tokens);
- ``passwords.json``: the embedded Redis's admin password, one Redis ACL user password per
  service and for the engines, one Postgres role password per service.

They are kept for the next ``up`` (a CLI holding the admin token keeps working) and removed
with the state dir. :func:`auth_env` turns token auth on for every service child;
:func:`redis_url_for` / :func:`postgres_url_for` give each child its own credentials on the
embedded servers, provisioned by :func:`provision_postgres` and the ACL file
(:func:`write_redis_acl`). External servers given with ``--postgres-url`` / ``--redis-url``
are used as given (their users and roles are the operator's; see deploy/).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.local.client import ADMIN_TOKEN_FILE, SECRETS_DIR
from services.common.security.access import Role
from services.common.security.stores import (
    ENGINE_USER,
    SERVICES,
    pg_role,
    postgres_setup_sql,
    redis_acl_file,
    redis_user,
    with_credentials,
)
from services.common.security.tokens import format_entry, new_token, read_token

__all__ = [
    "StackSecrets",
    "StoreUrls",
    "auth_env",
    "child_store_env",
    "load_or_create",
    "postgres_url_for",
    "provision_postgres",
    "redis_url_for",
    "write_redis_acl",
]

REDIS_ACL_FILE = "users.acl"


@dataclass(frozen=True)
class StackSecrets:
    root: Path
    redis_admin: str
    redis: Mapping[str, str]
    postgres: Mapping[str, str]

    @property
    def tokens_file(self) -> Path:
        return self.root / "tokens"

    @property
    def admin_token_file(self) -> Path:
        return self.root / ADMIN_TOKEN_FILE

    @property
    def service_token_file(self) -> Path:
        return self.root / "service.token"

    def admin_token(self) -> str:
        return read_token(self.admin_token_file)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _password() -> str:
    return secrets.token_urlsafe(24)


def load_or_create(state_dir: Path) -> StackSecrets:
    """The stack's secrets, made on first use (see the module doc)."""
    root = state_dir / SECRETS_DIR
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    store = root / "passwords.json"
    if not store.exists():
        doc = {
            "redis_admin": _password(),
            "redis": {who: _password() for who in (*SERVICES, ENGINE_USER)},
            "postgres": {svc: _password() for svc in SERVICES},
        }
        _write_private(store, json.dumps(doc, indent=2) + "\n")
    doc = json.loads(store.read_text(encoding="utf-8"))
    out = StackSecrets(root, doc["redis_admin"], doc["redis"], doc["postgres"])
    if not out.tokens_file.exists():
        admin, service = new_token(), new_token()
        _write_private(out.admin_token_file, admin + "\n")
        _write_private(out.service_token_file, service + "\n")
        lines = [
            "# tideserve up: hashed tokens (the tokens are in admin.token and service.token)",
            format_entry("stack-admin", Role.ADMIN, admin),
            format_entry("stack-services", Role.OPERATOR, service),
        ]
        _write_private(out.tokens_file, "\n".join(lines) + "\n")
    return out


def auth_env(s: StackSecrets) -> dict[str, str]:
    """Token auth on for a service child: checks calls against the stack's tokens, presents
    the services' token to its peers; read RPCs need a token too (``open_reads`` off)."""
    return {
        "TIDESERVE_AUTH__ENABLED": "true",
        "TIDESERVE_AUTH__TOKENS_FILE": str(s.tokens_file),
        "TIDESERVE_AUTH__TOKEN_FILE": str(s.service_token_file),
        "TIDESERVE_AUTH__OPEN_READS": "false",
    }


def write_redis_acl(s: StackSecrets, data_dir: Path, prefix: str) -> Path:
    """The embedded Redis's ACL file (in its data dir, so a restart keeps the users)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / REDIS_ACL_FILE
    _write_private(path, redis_acl_file(prefix, s.redis, s.redis_admin))
    return path


def redis_url_for(s: StackSecrets, who: str, admin_url: str) -> str:
    """The embedded Redis's URL with ``who``'s ACL user (a service or ``engine``)."""
    return with_credentials(admin_url, redis_user(who), s.redis[who])


def postgres_url_for(s: StackSecrets, service: str, admin_url: str) -> str:
    """The embedded Postgres's URL with ``service``'s own role."""
    return with_credentials(admin_url, pg_role(service), s.postgres[service])


def provision_postgres(s: StackSecrets, admin_url: str) -> None:
    """Create or update every service's role and schema (idempotent), as the superuser."""
    import psycopg

    from services.common.db import to_libpq_url

    with psycopg.connect(to_libpq_url(admin_url), autocommit=True) as conn:
        for statement in postgres_setup_sql(s.postgres, conn.info.dbname):
            conn.execute(statement.encode())


@dataclass(frozen=True)
class StoreUrls:
    """The stack's Postgres and Redis as ``up`` reached them, and which it started itself
    (only those get per-service credentials)."""

    postgres: str
    redis: str
    own_postgres: bool
    own_redis: bool


def child_store_env(
    s: StackSecrets | None, urls: StoreUrls, service: str | None, engine_env: str | None
) -> dict[str, str]:
    """The store URLs of one child: ``service`` (None for an engine) gets its own role and
    ACL user on servers the stack started; ``engine_env`` names the variable that carries
    the engines' Redis URL (the engines' ACL user) when the child is or starts engines."""
    pg, rd, engine_rd = urls.postgres, urls.redis, urls.redis
    if s is not None and urls.own_redis:
        engine_rd = redis_url_for(s, ENGINE_USER, urls.redis)
        if service is not None:
            rd = redis_url_for(s, service, urls.redis)
    if s is not None and urls.own_postgres and service is not None:
        pg = postgres_url_for(s, service, urls.postgres)
    env = {}
    if service is not None:
        env = {"TIDESERVE_POSTGRES_URL": pg, "TIDESERVE_REDIS_URL": rd}
    if engine_env is not None:
        env[engine_env] = engine_rd
    return env
