"""Command-line flags that override settings (pure helpers for the CLI verbs).

A verb declares its settings flags as a table of ``(flag, type, help)``; every flag defaults
to None so that only what the user typed overrides the settings file and environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["LOG_LEVEL", "STREAM_PREFIX", "Flag", "add_flags", "flag_overrides"]

Flag = tuple[str, type, str]
"""``("--block-size", int, "help")``: the settings key is the flag without dashes."""

STREAM_PREFIX: Flag = ("--stream-prefix", str, "stream name prefix (default ts)")
LOG_LEVEL: Flag = ("--log-level", str, "DEBUG, INFO, WARNING, ERROR")


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    """Add each flag of the table, defaulting to None (not given)."""
    for flag, typ, help_ in flags:
        parser.add_argument(flag, type=typ, default=None, help=help_)


def flag_overrides(
    args: argparse.Namespace, flags: Sequence[Flag], extra: Iterable[str] = ()
) -> dict[str, Any]:
    """The settings overrides the user gave: the table's flags and the ``extra`` argument
    names, leaving out those not given (None)."""
    keys = [f.lstrip("-").replace("-", "_") for f, _, _ in flags] + list(extra)
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
