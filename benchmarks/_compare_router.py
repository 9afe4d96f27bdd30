"""The router side of ``routing_compare.py``: each router's command line and its start.

``tideserve:<profile>`` is our gateway under the comparison's rules (the SLO through
``--slo-config``, or the old rules' class), ``sglang:<policy>`` sglang-router from its
throwaway venv; both take the fleet plan's endpoints, by role on a P/D fleet.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from _compare_fleet import wait_router
from _compare_rules import OLD_RULES_SLO_CLASS
from _harness import Child, ProcGroup, free_port, tideserve
from _model_client import start_model_server

__all__ = ["pd_endpoints", "router_cmd", "start_router"]


def pd_endpoints(plan: list[dict[str, Any]]) -> list[str]:
    """``--prefill URL BOOTSTRAP_PORT`` per prefill engine, ``--decode URL`` per decode one
    (both routers take them alike)."""
    out: list[str] = []
    for e in plan:
        if e["role"] == "prefill":
            out += ["--prefill", e["url"], str(e["bootstrap_port"])]
        else:
            out += ["--decode", e["url"]]
    return out


def router_cmd(
    name: str, port: int, plan: list[dict[str, Any]], args: argparse.Namespace, py: Path | None
) -> list[str]:
    kind, _, policy = name.partition(":")
    urls = [e["url"] for e in plan]
    if kind == "tideserve":
        cmd = tideserve("gateway", "--host", "127.0.0.1", "--port", str(port))
        if args.pd:
            cmd += pd_endpoints(plan)
            cmd += [
                "--decode-can-prefill" if args.decode_can_prefill else "--no-decode-can-prefill"
            ]
        else:
            cmd += ["--endpoints", *urls]
        if policy and policy != "default":
            cmd += ["--profile", policy]
        if args.old_rules:
            cmd += ["--default-slo-class", OLD_RULES_SLO_CLASS]
        else:
            if args.slo_config_file is None:
                raise ValueError("no --slo-config file written for the gateway")
            cmd += ["--slo-config", str(args.slo_config_file)]
        for extra in args.gateway_arg:
            cmd += shlex.split(extra)
        return cmd
    if kind == "sglang":
        assert py is not None
        cmd = [str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warn",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
        if args.pd:
            cmd += ["--pd-disaggregation", *pd_endpoints(plan)]
        else:
            cmd += ["--worker-urls", *urls]
        return [*cmd, "--policy", policy or "cache_aware"]
    raise ValueError(f"unknown router {name!r} (want tideserve:<profile> or sglang:<policy>)")


def start_router(
    name: str,
    args: argparse.Namespace,
    plan: list[dict[str, Any]],
    py: Path | None,
    group: ProcGroup,
    tag: str,
    v: dict[str, Any],
    streams: list[str],
) -> tuple[Child, str, list[str]]:
    """The router of one run on a free port, once it answers: (its child, URL, command)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = router_cmd(name, port, plan, args, py)
    if name.startswith("tideserve:"):
        cmd += streams
        if v.get("perf_profile"):
            cmd += ["--perf-profile", v["perf_profile"]]
        if v.get("fit"):
            cmd += ["--telemetry-address", start_model_server(group, v, tag),
                    "--perf-model-refresh", str(args.fit_refresh_s),
                    "--perf-model-min-confidence", str(args.fit_min_confidence)]  # fmt: skip
    router = group.start(f"{tag}-router", cmd)
    wait_router(name, url, len(plan), group)
    return router, url, cmd
