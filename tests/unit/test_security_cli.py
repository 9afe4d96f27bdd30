"""``tideserve token new`` and ``tideserve stores provision`` (the parts with no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli import main
from services.common.security.access import Role
from services.common.security.cli import store_passwords
from services.common.security.tokens import lookup, parse_tokens

WHO = ("SCHEDULER", "KVMETA", "AUTOSCALER", "TELEMETRY", "ENGINE")


def test_token_new_appends_only_the_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens"
    assert (
        main(["token", "new", "--name", "ci", "--role", "operator", "--tokens-file", str(tokens)])
        == 0
    )
    token = capsys.readouterr().out.strip()
    assert token and token not in tokens.read_text()
    found = lookup(parse_tokens(tokens.read_text()), token)
    assert found is not None and (found.name, found.role) == ("ci", Role.OPERATOR)


def test_token_new_refuses_an_unknown_role(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "new", "--name", "x", "--role", "root"]) == 2
    assert "unknown role 'root'" in capsys.readouterr().err


@pytest.mark.parametrize("missing", WHO, ids=WHO)
def test_store_passwords_name_the_missing_variable(missing: str) -> None:
    env = {f"STORE_PASSWORD_{w}": "x" for w in WHO if w != missing}
    with pytest.raises(ValueError, match=f"STORE_PASSWORD_{missing} is not set"):
        store_passwords(env)


def test_stores_provision_writes_the_acl_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for w in WHO:
        monkeypatch.setenv(f"STORE_PASSWORD_{w}", f"pw-{w}")
    monkeypatch.setenv("STORE_ADMIN_PASSWORD", "admin")
    acl = tmp_path / "acl" / "users.acl"
    assert main(["stores", "provision", "--redis-acl-file", str(acl), "--stream-prefix", "p"]) == 0
    text = acl.read_text()
    assert "user tideserve-autoscaler " in text and "~p:membership*" in text
    assert "pw-" not in text and ">" not in text  # hashes only (">pw" is a plaintext one)


def test_cli_with_an_unreadable_token_file_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIDESERVE_AUTH__TOKEN_FILE", str(tmp_path / "missing.token"))
    monkeypatch.chdir(tmp_path)
    code = main(["get", "deployments", "--autoscaler", "127.0.0.1:1", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "missing.token" in err and len(err.strip().splitlines()) == 1
