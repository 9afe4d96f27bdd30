"""``tideserve get windows``, ``tideserve get session`` and ``tideserve top``: views of the
telemetry service over gRPC (its address from ``--address``, else the running stack's state
file, else 127.0.0.1:50054)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from services.common.verbs import kinds

if TYPE_CHECKING:
    from tideserve.v1 import events_pb2, telemetry_pb2

__all__ = ["parse_duration", "register", "render_session", "render_top", "render_windows"]

DEFAULT_ADDRESS = "127.0.0.1:50054"

_EPILOG_GET = """\
examples:
  tideserve get windows --deployment llama --last 5m     # total and one row per slice
  tideserve get windows --last 1h --class interactive --json
  tideserve get session agent-42                         # an agent session's turns in order
"""
_EPILOG_TOP = """\
examples:
  tideserve top                   # refreshes every 2 s; Ctrl-C to leave
  tideserve top --once --window 5m
"""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"90"``/``"90s"``, ``"5m"``, ``"1.5h"``, ``"2d"``, ``"500ms"`` -> seconds (> 0)."""
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {text!r} (e.g. 30s, 5m, 1h)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # ``get`` is shared with other services' kinds (services.common.verbs.kinds)
    what = kinds(subparsers, "get", "list resources")
    win = what.add_parser(
        "windows",
        help="request statistics over a window, per slice",
        epilog=_EPILOG_GET,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    win.add_argument("--deployment", default="", help="deployment (default: all)")
    win.add_argument("--last", type=parse_duration, default=300.0, help="window (default 5m)")
    win.add_argument("--class", dest="slo_class", default="", help="SLO class (default: all)")
    win.add_argument("--tenant", default="", help="tenant (default: all)")
    win.add_argument("--role", default="", choices=["", "worker", "prefill", "decode"])
    _common(win)
    win.set_defaults(func=cmd_windows)
    ses = what.add_parser(
        "session",
        help="an agent session's turns in order",
        epilog=_EPILOG_GET,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ses.add_argument("session_id", metavar="ID")
    ses.add_argument("--limit", type=int, default=0, help="the most recent N turns (0 = all)")
    ses.add_argument("--tenant", default="", help="only this tenant's turns (default: all)")
    _common(ses)
    ses.set_defaults(func=cmd_session)
    top = subparsers.add_parser(
        "top",
        help="live view of rate, TTFT, TPOT and hit ratio per deployment and role",
        epilog=_EPILOG_TOP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--deployment", default="", help="deployment (default: all)")
    top.add_argument("--window", type=parse_duration, default=60.0, help="window (default 1m)")
    top.add_argument("--interval", type=parse_duration, default=2.0, help="refresh (default 2s)")
    top.add_argument("--once", action="store_true", help="print one view and exit")
    _common(top, json_flag=False)
    top.set_defaults(func=cmd_top)


def _common(p: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    p.add_argument(
        "--address", default="", help=f"telemetry gRPC (default: stack, {DEFAULT_ADDRESS})"
    )
    p.add_argument("--state-dir", metavar="DIR", help="stack state directory (for the address)")
    p.add_argument("--timeout", type=float, default=10.0, help="RPC timeout in seconds")
    if json_flag:
        p.add_argument("--json", action="store_true", help="the response as JSON")


# --------------------------------------------------------------------------- shell


def _address(args: argparse.Namespace) -> str:
    if args.address:
        return str(args.address)
    from services.common.local.client import stack_state_dir
    from services.common.local.state import read_state

    try:
        state = read_state(stack_state_dir(args.state_dir))
    except (ValueError, OSError):
        state = None
    for proc in state.services() if state is not None else []:
        if proc.name == "telemetry" and proc.grpc_address:
            return proc.grpc_address
    return DEFAULT_ADDRESS


def _call(args: argparse.Namespace, verb: str, fn: Callable[[Any], Any]) -> Any:
    """Run ``fn(stub)``; prints one error line and returns None on an RPC error."""
    import grpc
    from tideserve.v1 import telemetry_pb2_grpc

    from services.common.local.client import cli_security, stack_state_dir
    from services.common.security.channels import sync_channel
    from services.common.settings import SettingsError

    address = _address(args)
    try:
        channel = sync_channel(address, cli_security(address, stack_state_dir(args.state_dir)))
    except (SettingsError, ValueError) as exc:  # a bad TLS/auth setting or file
        print(f"tideserve {verb}: {exc}", file=sys.stderr)
        return None
    with channel:
        stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
        try:
            return fn(stub)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "ERROR"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            print(f"tideserve {verb}: {address}: {code}: {details}", file=sys.stderr)
            return None


def _dump(msg: Any, out: TextIO) -> None:
    from google.protobuf.json_format import MessageToDict

    json.dump(MessageToDict(msg, preserving_proto_field_name=True), out, indent=2)
    out.write("\n")


def cmd_windows(args: argparse.Namespace) -> int:
    from tideserve.v1 import telemetry_pb2

    req = telemetry_pb2.QueryWindowRequest(
        deployment=args.deployment,
        window_s=args.last,
        slo_class=args.slo_class,
        tenant=args.tenant,
        role=args.role,
    )
    resp = _call(args, "get windows", lambda s: s.QueryWindow(req, timeout=args.timeout))
    if resp is None:
        return 1
    if args.json:
        _dump(resp, sys.stdout)
    else:
        sys.stdout.write(render_windows(resp))
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    from tideserve.v1 import telemetry_pb2

    req = telemetry_pb2.GetSessionRequest(
        session_id=args.session_id, limit=args.limit, tenant=args.tenant
    )
    resp = _call(args, "get session", lambda s: s.GetSession(req, timeout=args.timeout))
    if resp is None:
        return 1
    if args.json:
        _dump(resp, sys.stdout)
    else:
        sys.stdout.write(render_session(args.session_id, resp.turns))
    return 0


def top_rows(stub: Any, deployment: str, window_s: float, timeout: float) -> list[Any]:
    """One exact WindowStats per deployment x role seen in the window."""
    from tideserve.v1 import telemetry_pb2

    first = stub.QueryWindow(
        telemetry_pb2.QueryWindowRequest(deployment=deployment, window_s=window_s), timeout=timeout
    )
    pairs = sorted({(s.deployment, s.role) for s in first.slices})
    rows = []
    for dep, role in pairs:
        req = telemetry_pb2.QueryWindowRequest(
            deployment=dep, role=role, window_s=window_s, end_ms=first.total.end_ms
        )
        rows.append(stub.QueryWindow(req, timeout=timeout).total)
    return rows


def cmd_top(args: argparse.Namespace) -> int:
    live = not args.once and sys.stdout.isatty()
    while True:
        rows = _call(args, "top", lambda s: top_rows(s, args.deployment, args.window, args.timeout))
        if rows is None:
            return 1
        view = render_top(rows, args.window, time.strftime("%H:%M:%S"))
        sys.stdout.write(("\x1b[H\x1b[2J" if live else "") + view)
        sys.stdout.flush()
        if args.once:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


# --------------------------------------------------------------------------- rendering (pure)


def _ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def render_windows(resp: telemetry_pb2.QueryWindowResponse) -> str:
    t = resp.total
    span = (t.end_ms - t.start_ms) / 1000
    lines = [
        f"window {span:.0f}s ending {time.strftime('%H:%M:%S', time.localtime(t.end_ms / 1000))}"
        f"  source {resp.source}  percentiles within ±{resp.relative_accuracy:.0%}",
        f"{'deployment':<14} {'role':<8} {'class':<12} {'tenant':<10} {'reqs':>7} {'rps':>7} "
        f"{'ttft p50/p90/p99 ms':>21} {'tpot p50/p99':>13} {'hit':>5} {'slo':>5} {'err':>5}",
    ]
    for s in [t, *resp.slices]:
        name = (s.deployment or "*", s.role or "*", s.slo_class or "*", s.tenant or "*")
        ttft = f"{_ms(s.ttft_ms.p50)}/{_ms(s.ttft_ms.p90)}/{_ms(s.ttft_ms.p99)}"
        tpot = f"{_ms(s.tpot_ms.p50)}/{_ms(s.tpot_ms.p99)}"
        lines.append(
            f"{name[0]:<14} {name[1]:<8} {name[2]:<12} {name[3]:<10} {s.requests:>7} "
            f"{s.request_rate_rps:>7.2f} {ttft:>21} {tpot:>13} {s.cache_hit_ratio:>5.0%} "
            f"{s.slo_attainment:>5.0%} {s.error_rate:>5.0%}"
        )
    for c in t.classes:
        lines.append(
            f"class {c.slo_class}: p{c.percentile:g} ttft {_ms(c.ttft_ms)} ms "
            f"(target {_ms(c.ttft_target_ms) if c.ttft_target_ms else '-'}), tpot {_ms(c.tpot_ms)} ms "
            f"(target {_ms(c.tpot_target_ms) if c.tpot_target_ms else '-'}): "
            f"{'met' if c.met else 'NOT met'}"
        )
    return "\n".join(lines) + "\n"


def routing_reason(rec: events_pb2.RequestRecord, top: int = 2) -> str:
    """``profile`` + the ``top`` plugins by weighted score."""
    scores = sorted(rec.scores, key=lambda s: s.score * (s.weight or 1.0), reverse=True)[:top]
    parts = [f"{s.plugin}={s.score:.2f}" for s in scores]
    return " ".join([rec.profile or "-", *parts])


def render_session(session_id: str, turns: Sequence[events_pb2.RequestRecord]) -> str:
    lines = [
        f"session {session_id}: {len(turns)} turns",
        f"{'#':>3} {'request':<20} {'ttft ms':>8} {'tpot ms':>8} {'cached':>7} {'uncached':>8} "
        f"{'engine':<16} {'reason':<34} tools",
    ]
    for i, r in enumerate(turns, 1):
        engine = r.decode_instance or r.prefill_instance or "-"
        calls = [c.name for c in r.tool_calls]
        results = [t.name or t.tool_call_id for t in r.tool_results]
        tools = ", ".join([*(f"call {n}" for n in calls), *(f"result {n}" for n in results)]) or "-"
        lines.append(
            f"{i:>3} {r.request_id[:20]:<20} {_ms(r.ttft_ms):>8} {_ms(r.tpot_ms):>8} "
            f"{r.cached_tokens:>7} {max(r.prompt_tokens - r.cached_tokens, 0):>8} "
            f"{engine[:16]:<16} {routing_reason(r)[:34]:<34} {tools}"
        )
    return "\n".join(lines) + "\n"


def render_top(rows: Sequence[telemetry_pb2.WindowStats], window_s: float, clock: str) -> str:
    lines = [
        f"tideserve top — last {window_s:g}s — {clock}",
        f"{'deployment':<16} {'role':<8} {'rps':>8} {'ttft p50':>9} {'ttft p99':>9} "
        f"{'tpot p50':>9} {'tpot p99':>9} {'hit':>5}",
    ]
    for s in rows:
        lines.append(
            f"{s.deployment:<16} {s.role:<8} {s.request_rate_rps:>8.2f} {_ms(s.ttft_ms.p50):>9} "
            f"{_ms(s.ttft_ms.p99):>9} {_ms(s.tpot_ms.p50):>9} {_ms(s.tpot_ms.p99):>9} "
            f"{s.cache_hit_ratio:>5.0%}"
        )
    if not rows:
        lines.append("(no requests in the window)")
    return "\n".join(lines) + "\n"
