"""``tideserve keys create|list|revoke``: the gateway's API keys.

These verbs write Postgres directly (the ``scheduler.api_keys`` table, migrated first if
needed): whoever holds the scheduler's database credentials administers its keys, and no
key-administration RPC is exposed on the network. The database is ``--postgres-url``, else
the scheduler's settings (``TIDESERVE_POSTGRES_URL``, ``tideserve.yaml``), else the
running local stack's (``tideserve up``). ``create`` prints the key once; only its SHA-256
is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.scheduler.keys.model import ApiKey

if TYPE_CHECKING:
    from services.scheduler.keys.store import KeyStore

__all__ = ["register"]

_EPILOG = """\
examples:
  tideserve keys create --tenant acme --class interactive --class agent --rpm 600 --tpm 200000
  tideserve keys create --tenant batchco --class batch --name nightly --json
  tideserve keys list                 # live keys (prefix, tenant, classes, limits)
  tideserve keys list --all --json    # revoked ones too
  tideserve keys revoke key_1a2b3c4d5e6f   # by id (or by its visible prefix)

Turn keys on in the scheduler with api_keys: true (e.g. TIDESERVE_SCHEDULER__API_KEYS=true);
clients then send 'Authorization: Bearer sk-ts-...'. A revoked key stops working within
api_key_cache_ttl_s (5 s by default).
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "keys",
        help="create, list and revoke the gateway's API keys",
        description="API keys of the OpenAI-compatible gateway: each maps to a tenant, the "
        "SLO classes it may use and optional requests/tokens per minute.",
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    verbs = p.add_subparsers(dest="keys_verb", metavar="<create|list|revoke>", required=True)
    create = verbs.add_parser("create", help="a new key (printed once)", epilog=_EPILOG)
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="NAME",
        help="an SLO class the key may use (repeatable; none = every class)",
    )
    create.add_argument("--rpm", type=int, help="requests per minute of its tenant")
    create.add_argument("--tpm", type=int, help="tokens (prompt + max_tokens) per minute")
    create.add_argument("--name", default="", help="a label for listings")
    create.set_defaults(func=_run(_create))
    lst = verbs.add_parser("list", help="the keys (never the secrets)", epilog=_EPILOG)
    lst.add_argument("--all", action="store_true", help="revoked keys too")
    lst.set_defaults(func=_run(_list))
    revoke = verbs.add_parser("revoke", help="revoke a key", epilog=_EPILOG)
    revoke.add_argument("key", metavar="ID_OR_PREFIX", help="key id (key_...) or prefix")
    revoke.set_defaults(func=_run(_revoke))
    for sub in (create, lst, revoke):
        sub.add_argument("--postgres-url", metavar="URL", help="the scheduler's database")
        sub.add_argument("--config", metavar="FILE", help="YAML settings file")
        sub.add_argument("--state-dir", metavar="DIR", help="the local stack's state directory")
        sub.add_argument("--json", action="store_true", help="machine-readable output")


class _Fail(Exception):
    pass


def _postgres_url(args: argparse.Namespace) -> str:
    from services.common.local.client import stack_state_dir
    from services.common.local.state import read_state
    from services.common.settings import load_settings
    from services.scheduler.settings import SchedulerSettings

    if args.postgres_url:
        return str(args.postgres_url)
    cfg = Path(args.config) if args.config else None
    url = load_settings(SchedulerSettings, "scheduler", cfg, {}).postgres_url
    if url:
        return url
    state = read_state(stack_state_dir(args.state_dir, cfg))
    if state is not None and state.postgres_url:
        return state.postgres_url
    raise _Fail("no database: pass --postgres-url, set postgres_url, or run `tideserve up`")


def _run(verb: Callable[[KeyStore, argparse.Namespace], Awaitable[int]]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        from services.common import db
        from services.scheduler.keys.store import KeyStore

        async def go() -> int:
            url = _postgres_url(args)
            await asyncio.to_thread(db.migrate, url, "scheduler")
            store = KeyStore(url, pool_size=1)
            try:
                return await verb(store, args)
            finally:
                await store.close()

        try:
            return asyncio.run(go())
        except (_Fail, ValueError, ConnectionError) as e:
            print(f"tideserve keys {args.keys_verb}: {e}", file=sys.stderr)
            return 2

    return run


def _doc(k: ApiKey) -> dict[str, Any]:
    d = asdict(k)
    d["slo_classes"] = list(k.slo_classes)
    return d


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _row(k: ApiKey) -> str:
    classes = ",".join(k.slo_classes) or "*"
    rpm = "-" if k.rpm is None else str(k.rpm)
    tpm = "-" if k.tpm is None else str(k.tpm)
    state = "live" if k.live else f"revoked {_when(k.revoked_at)}"
    return (
        f"{k.key_id:<17} {k.prefix:<13} {k.tenant:<16} {classes:<22} {rpm:>7} {tpm:>9} "
        f"{_when(k.created_at):<19} {state}  {k.name}"
    )


_HEADER = (
    f"{'id':<17} {'prefix':<13} {'tenant':<16} {'classes':<22} {'rpm':>7} {'tpm':>9} "
    f"{'created (UTC)':<19} state  name"
)


async def _create(store: KeyStore, args: argparse.Namespace) -> int:
    key, secret = await store.create(
        args.tenant, slo_classes=args.classes, rpm=args.rpm, tpm=args.tpm, name=args.name
    )
    if args.json:
        print(json.dumps({**_doc(key), "key": secret}))
    else:
        print(f"created {key.key_id} for tenant {key.tenant!r}; the key (shown only now):")
        print(secret)
    return 0


async def _list(store: KeyStore, args: argparse.Namespace) -> int:
    keys = await store.list(include_revoked=args.all)
    if args.json:
        print(json.dumps({"keys": [_doc(k) for k in keys]}))
        return 0
    print(_HEADER)
    for k in keys:
        print(_row(k))
    return 0


async def _revoke(store: KeyStore, args: argparse.Namespace) -> int:
    key = await store.revoke(args.key)
    if key is None:
        raise _Fail(f"no key {args.key!r}")
    if args.json:
        print(json.dumps(_doc(key)))
    else:
        print(f"revoked {key.key_id} ({key.prefix}..., tenant {key.tenant!r})")
    return 0
