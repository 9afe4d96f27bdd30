"""How a CLI finds the local stack (``tideserve up``): its state directory and, for the
stack's own gRPC addresses only, its admin token.

The stack writes both (:mod:`services.common.local.state`, ``services.stack.secure``); the
services' CLIs (``tideserve get``, ``top``, ``keys``, ...) read them here, so that no
service imports the stack.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from services.common.local.state import read_state
from services.common.security.channels import ClientSecurity
from services.common.security.tokens import read_token

__all__ = ["ADMIN_TOKEN_FILE", "SECRETS_DIR", "cli_security", "stack_state_dir"]

SECRETS_DIR = "secrets"
"""``<state_dir>/secrets``: the stack's tokens and store passwords."""
ADMIN_TOKEN_FILE = "admin.token"
"""The stack's admin token (role admin), in :data:`SECRETS_DIR`."""


def stack_state_dir(flag: str | Path | None, config: Path | None = None) -> Path:
    """The local stack's state directory: ``flag`` (``--state-dir``), else the ``stack``
    section's ``state_dir`` (``TIDESERVE_STATE_DIR``, ``tideserve.yaml`` or ``config``,
    default ``~/.local/share/tideserve``), as ``tideserve up`` resolves it."""
    from services.common.settings import ServiceSettings, load_settings

    overrides = {"state_dir": str(flag) if flag is not None else None}
    settings = load_settings(ServiceSettings, "stack", config, overrides)
    return Path(settings.state_dir).expanduser().resolve()


def cli_security(address: str, state_dir: Path | None = None) -> ClientSecurity:
    """How a CLI dials ``address``: the ``tls``/``auth`` settings (``TIDESERVE_TLS__*``,
    ``TIDESERVE_AUTH__TOKEN_FILE``, ``tideserve.yaml``); when they name no token and
    ``address`` is a gRPC address of the local stack recorded in ``state_dir`` (default: the
    settings' ``state_dir``), that stack's admin token. The token goes to no other address."""
    from services.common.settings import ServiceSettings, load_settings

    overrides = {"state_dir": str(state_dir) if state_dir is not None else None}
    settings = load_settings(ServiceSettings, "cli", None, overrides)
    security = ClientSecurity.of(settings)
    if security.token is not None:
        return security
    root = Path(settings.state_dir).expanduser()
    try:
        state = read_state(root)
    except (ValueError, OSError):
        return security
    if state is None or address not in {p.grpc_address for p in state.processes}:
        return security
    token_file = root / SECRETS_DIR / ADMIN_TOKEN_FILE
    if not token_file.exists():
        return security
    return dataclasses.replace(security, token=read_token(token_file))
