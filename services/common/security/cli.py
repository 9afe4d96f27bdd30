"""``tideserve token new`` and ``tideserve stores provision``: the operator's side of gRPC
token auth and of least privilege in the state stores (deploy/ runs the latter)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from services.common.security.access import Role
from services.common.security.stores import (
    ENGINE_USER,
    SERVICES,
    postgres_setup_sql,
    redis_acl_file,
)
from services.common.security.tokens import format_entry, new_token

__all__ = ["register", "store_passwords"]

PASSWORD_ENV = "STORE_PASSWORD_"
ADMIN_ENV = "STORE_ADMIN_PASSWORD"

_EPILOG_TOKEN = """\
examples:
  tideserve token new --name ci --role operator --tokens-file /etc/tideserve/tokens > ci.token
  tideserve token new --name grafana --role read-only     # prints the token and its line
"""

_EPILOG_STORES = f"""\
Passwords come from the environment: {PASSWORD_ENV}<WHO> for each of
{", ".join(w.upper() for w in (*SERVICES, ENGINE_USER))} (Postgres roles and Redis users use
the same one) and {ADMIN_ENV} (Redis's default user, needed with --redis-acl-file).
examples:
  tideserve stores provision --postgres-url postgresql://admin:pw@db:5432/tideserve
  tideserve stores provision --redis-acl-file /acl/users.acl   # then redis-server --aclfile
  tideserve stores provision --postgres-url URL --dry-run      # print, change nothing
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    token = subparsers.add_parser(
        "token", help="gRPC auth tokens", epilog=_EPILOG_TOKEN, formatter_class=fmt
    )
    tsub = token.add_subparsers(dest="action", metavar="<action>", required=True)
    new = tsub.add_parser("new", help="make a token; print it (stdout) and its hashed line")
    new.add_argument("--name", required=True, help="who holds it (shown in refusals)")
    new.add_argument("--role", required=True, help="read-only, operator or admin")
    new.add_argument("--tokens-file", type=Path, help="append the hashed line to this file")
    new.set_defaults(func=cmd_token_new)
    stores = subparsers.add_parser(
        "stores",
        help="least privilege in Postgres and Redis",
        epilog=_EPILOG_STORES,
        formatter_class=fmt,
    )
    ssub = stores.add_subparsers(dest="action", metavar="<action>", required=True)
    prov = ssub.add_parser(
        "provision",
        help="one Postgres role and one Redis ACL user per service",
        epilog=_EPILOG_STORES,
        formatter_class=fmt,
    )
    prov.add_argument("--postgres-url", help="a superuser's URL: create roles and schemas")
    prov.add_argument("--redis-acl-file", type=Path, help="write the Redis ACL file here")
    prov.add_argument("--stream-prefix", default="ts", help="prefix of the streams (ts)")
    prov.add_argument("--dry-run", action="store_true", help="print what would be done")
    prov.set_defaults(func=cmd_stores_provision)


def cmd_token_new(args: argparse.Namespace) -> int:
    try:
        role = Role.parse(args.role)
    except ValueError as err:
        print(f"tideserve token: {err}", file=sys.stderr)
        return 2
    token = new_token()
    line = format_entry(args.name, role, token)
    if args.tokens_file is not None:
        with open(args.tokens_file, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    else:
        print(f"# tokens-file line: {line}", file=sys.stderr)
    print(token)
    return 0


def store_passwords(env: Mapping[str, str]) -> dict[str, str]:
    """Each service's (and the engines') password from ``env``; ValueError naming the
    variable that is missing."""
    out = {}
    for who in (*SERVICES, ENGINE_USER):
        name = PASSWORD_ENV + who.upper()
        value = env.get(name, "")
        if not value:
            raise ValueError(f"{name} is not set")
        out[who] = value
    return out


def cmd_stores_provision(args: argparse.Namespace) -> int:
    if args.postgres_url is None and args.redis_acl_file is None:
        print("tideserve stores: give --postgres-url and/or --redis-acl-file", file=sys.stderr)
        return 2
    try:
        passwords = store_passwords(os.environ)
        admin = os.environ.get(ADMIN_ENV, "")
        if args.redis_acl_file is not None and not admin:
            raise ValueError(f"{ADMIN_ENV} is not set")
    except ValueError as err:
        print(f"tideserve stores: {err}", file=sys.stderr)
        return 2
    if args.redis_acl_file is not None:
        text = redis_acl_file(args.stream_prefix, passwords, admin)
        if args.dry_run:
            print(text, end="")
        else:
            args.redis_acl_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(args.redis_acl_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
    if args.postgres_url is not None:
        return _provision_postgres(args.postgres_url, passwords, args.dry_run)
    return 0


def _provision_postgres(url: str, passwords: Mapping[str, str], dry_run: bool) -> int:
    import psycopg

    from services.common.db import to_libpq_url

    try:
        with psycopg.connect(to_libpq_url(url), autocommit=True, connect_timeout=10) as conn:
            statements = postgres_setup_sql(passwords, conn.info.dbname)
            for statement in statements:
                if dry_run:
                    print(statement + ";")
                else:
                    conn.execute(statement.encode())
    except (psycopg.Error, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"tideserve stores: postgres: {first}", file=sys.stderr)
        return 1
    return 0
