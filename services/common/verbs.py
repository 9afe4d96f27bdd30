"""Verbs shared by several command modules of the ``tideserve`` command.

A verb's flags can be data: a table of :func:`flag` entries added with :func:`add_flags`.

Verbs taking a kind (``get deployments``, ``get windows``, ``describe deployment``) are
shared between modules: each adds its kinds to :func:`kinds` ``(subparsers, "get", ...)``,
which creates the verb the first time and returns its kind sub-parsers after that.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

__all__ = ["Flag", "add_flags", "flag", "kinds"]

Flag = tuple[tuple[str, ...], dict[str, Any]]
"""One ``add_argument`` call: its names and its options."""


def flag(*names: str, **options: Any) -> Flag:
    """A row of a flag table: ``flag("--port", type=int, help=...)``."""
    return names, options


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """``parser.add_argument`` for each row of ``flags``, in order."""
    for names, options in flags:
        parser.add_argument(*names, **options)


def kinds(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    verb: str,
    help_: str,
    epilog: str = "",
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The ``<verb> <kind>`` sub-parsers of a shared verb (created by the first caller; a
    later caller's ``help_``/``epilog`` are ignored). Each kind sets its own ``func``."""
    existing = subparsers.choices.get(verb)
    if existing is not None:
        action = existing.get_default("kinds_action")
        if not isinstance(action, argparse._SubParsersAction):
            raise TypeError(f"verb {verb!r} exists and does not take kinds")
        return action
    parser = subparsers.add_parser(
        verb,
        help=help_,
        description=f"{help_} (tideserve {verb} <kind> --help for each kind)",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    action = parser.add_subparsers(dest="kind", metavar="<kind>", required=True)
    parser.set_defaults(kinds_action=action)
    return action
