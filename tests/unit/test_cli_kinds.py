"""Shared kind verbs (`get <kind>`, `describe <kind>`): several modules add kinds to one verb."""

from __future__ import annotations

import argparse

import pytest

from services.common.verbs import kinds


def _parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
    parser = argparse.ArgumentParser(prog="tideserve")
    return parser, parser.add_subparsers(dest="verb", required=True)


@pytest.mark.parametrize(
    ("argv", "picked"),
    [(["get", "deployments"], "deployments"), (["get", "windows", "--deployment", "d"], "windows")],
    ids=["first-module-kind", "second-module-kind"],
)
def test_two_modules_share_get(argv: list[str], picked: str) -> None:
    parser, sub = _parser()
    first = kinds(sub, "get", "list resources")
    first.add_parser("deployments").set_defaults(func=lambda _a: "deployments")
    second = kinds(sub, "get", "ignored: the verb exists")
    assert second is first
    windows = second.add_parser("windows")
    windows.add_argument("--deployment")
    windows.set_defaults(func=lambda _a: "windows")
    args = parser.parse_args(argv)
    assert args.func(args) == picked


def test_a_plain_verb_of_that_name_is_refused() -> None:
    _, sub = _parser()
    sub.add_parser("get")
    with pytest.raises(TypeError, match="does not take kinds"):
        kinds(sub, "get", "list resources")
