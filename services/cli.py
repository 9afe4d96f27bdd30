"""The ``tideserve`` command: one argparse parser, verbs contributed by command modules.

Each module in :data:`COMMAND_MODULES` exposes ``register(subparsers)`` which adds its verbs
and sets ``func=<callable(args) -> int>`` on each. A module that does not exist (yet) is
skipped; a module that exists but fails to import is an error (never hidden).

Verbs taking a kind (``get deployments``, ``get windows``, ``describe deployment``) are
shared between modules: each adds its kinds with :func:`services.common.verbs.kinds`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES: list[str] = [
    "services.stack.cli",
    "services.stack.probe",
    "services.engine.cli",
    "services.bench.cli",
    "services.sim.cli",
    "services.sim.recommend",
    "services.scheduler.cli",
    "services.scheduler.keys.cli",
    "services.kvbridge.cli",
    "services.autoscaler.cli",
    "services.telemetry.cli",
    "services.common.security.cli",
]

_EPILOG = """\
examples:
  tideserve up                    # local stack: embedded Postgres + Redis, four services
  tideserve status --json         # health of every service
  tideserve down                  # stop it all
  tideserve <verb> --help         # examples for each verb
"""


def _import_optional(name: str) -> object | None:
    """Import ``name``; None when that module (or a parent package) does not exist."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if name == missing or name.startswith(missing + "."):
            return None
        raise


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The top-level parser with every available verb registered."""
    parser = argparse.ArgumentParser(
        prog="tideserve",
        description="Tideserve: control plane for disaggregated, KV-cache-centric LLM inference.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for name in modules:
        module = _import_optional(name)
        if module is None:
            continue
        register = getattr(module, "register", None)
        if not callable(register):
            raise TypeError(f"command module {name} has no register(subparsers)")
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns its exit code (2 for usage errors, 130 on Ctrl-C)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
