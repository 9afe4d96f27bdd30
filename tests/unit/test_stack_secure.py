"""The local stack's secrets: made once, private, one credential per service, and the
admin token sent only to the stack's own addresses."""

from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from services.common.local.client import cli_security
from services.common.local.state import ProcEntry, StackState, write_state
from services.common.security.tokens import lookup, parse_tokens, read_token
from services.stack.engines import ENGINE_REDIS_ENV
from services.stack.secure import StoreUrls, child_store_env, load_or_create

PG = "postgresql://postgres@/postgres?host=/tmp/s&port=5432"
RD = "redis://default:adminpw@127.0.0.1:6380/0"


def test_secrets_are_private_and_kept(tmp_path: Path) -> None:
    first = load_or_create(tmp_path)
    assert stat.S_IMODE(first.root.stat().st_mode) == 0o700
    for f in first.root.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    again = load_or_create(tmp_path)
    assert again == first and again.admin_token() == first.admin_token()
    entries = parse_tokens(first.tokens_file.read_text())
    admin = lookup(entries, first.admin_token())
    service = lookup(entries, read_token(first.service_token_file))
    assert admin is not None and admin.role.label == "admin"
    assert service is not None and service.role.label == "operator"
    assert len(set(first.postgres.values())) == 4 and len(set(first.redis.values())) == 5


OWN = StoreUrls(PG, RD, own_postgres=True, own_redis=True)
EXTERNAL = StoreUrls(PG, RD, own_postgres=False, own_redis=False)
CASES = [
    # urls, service, engine env?, expected (pg user, redis user, engine redis user)
    (OWN, "kvmeta", False, ("tideserve_kvmeta", "tideserve-kvmeta", None)),
    (OWN, "autoscaler", True, ("tideserve_autoscaler", "tideserve-autoscaler", "tideserve-engine")),
    (OWN, None, True, (None, None, "tideserve-engine")),
    (EXTERNAL, "kvmeta", False, ("postgres", "default", None)),
    (EXTERNAL, None, True, (None, None, "default")),
]


@pytest.mark.parametrize(
    ("urls", "service", "engines", "expected"),
    CASES,
    ids=["own-kvmeta", "own-autoscaler+engines", "own-engine", "external", "external-engine"],
)
def test_each_child_gets_its_own_store_user(
    tmp_path: Path,
    urls: StoreUrls,
    service: str | None,
    engines: bool,
    expected: tuple[str | None, str | None, str | None],
) -> None:
    s = load_or_create(tmp_path)
    env = child_store_env(s, urls, service, ENGINE_REDIS_ENV if engines else None)

    def user(key: str) -> str | None:
        return urlsplit(env[key]).username if key in env else None

    got = (user("TIDESERVE_POSTGRES_URL"), user("TIDESERVE_REDIS_URL"), user(ENGINE_REDIS_ENV))
    assert got == expected
    if urls.own_redis and service is not None:
        assert urlsplit(env["TIDESERVE_REDIS_URL"]).password == s.redis[service]


def _stack(tmp_path: Path, address: str) -> None:
    load_or_create(tmp_path)
    up = ProcEntry("up", 1, None, kind="up")
    entry = ProcEntry("autoscaler", 2, None, kind="service", grpc_address=address)
    write_state(tmp_path, StackState(up=up, state_dir=str(tmp_path), processes=[entry]))


@pytest.mark.parametrize(
    ("target", "gets_token"),
    [("127.0.0.1:50053", True), ("10.0.0.9:50053", False)],
    ids=["the-stacks-address", "another-address"],
)
def test_cli_sends_the_stack_token_only_to_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, gets_token: bool
) -> None:
    for key in ("TIDESERVE_AUTH__TOKEN_FILE", "TIDESERVE_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    _stack(tmp_path, "127.0.0.1:50053")
    token = cli_security(target, tmp_path).token
    assert (token == load_or_create(tmp_path).admin_token()) if gets_token else token is None


def test_a_configured_token_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.token"
    mine.write_text("my-token\n")
    monkeypatch.setenv("TIDESERVE_AUTH__TOKEN_FILE", str(mine))
    _stack(tmp_path, "127.0.0.1:50053")
    assert cli_security("127.0.0.1:50053", tmp_path).token == "my-token"


@pytest.mark.parametrize("insecure", [False, True], ids=["default-secure", "insecure-flag"])
def test_up_secures_its_stack_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, insecure: bool
) -> None:
    from services.cli import build_parser
    from services.stack.cli import resolve_up

    monkeypatch.delenv("TIDESERVE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["up", "--state-dir", str(tmp_path / "st"), *(["--insecure"] if insecure else [])]
    opts, children = resolve_up(build_parser().parse_args(argv))
    assert (opts.secrets is None) == insecure
    assert (tmp_path / "st" / "secrets").exists() != insecure
    for child in children:
        assert (child.env.get("TIDESERVE_AUTH__ENABLED") == "true") != insecure, child.name
