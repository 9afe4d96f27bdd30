"""``tideserve apply -f FILE``, ``get deployments``, ``describe deployment NAME``, ``plan``,
``scale deployment NAME --role R --replicas N`` (a manual override the planner holds: a pin,
until the next changed apply or ``--release``).

Clients of the autoscaler's gRPC API (``--autoscaler`` host:port, default 127.0.0.1:50053).
Every verb prints a human table by default and one JSON document with ``--json``. ``get``
and ``describe`` are shared verbs: each command module adds its kinds through
:func:`services.common.verbs.kinds` (``get deployments`` here; other modules add e.g. ``get
windows``). ``apply`` validates the file locally first (the same validator the server runs),
so a bad spec is refused naming the field without a round trip.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc, common_pb2

from services.autoscaler.translate import role_name, spec_to_proto
from services.common.planner.spec import SpecError, load_spec_file
from services.common.verbs import kinds

__all__ = ["register", "render_describe", "render_get", "render_plan"]

DEFAULT_ADDRESS = "127.0.0.1:50053"

_EPILOG_APPLY = """\
examples:
  tideserve apply -f deploy/examples/pd.yaml          # create or update (idempotent)
  tideserve apply -f deploy/examples/aggregated.yaml --json
"""
_EPILOG_GET = """\
examples:
  tideserve get deployments
  tideserve get deployments --json
"""
_EPILOG_DESCRIBE = """\
examples:
  tideserve describe deployment chat-pd      # desired vs actual, instances, last decisions
  tideserve describe deployment chat-pd --json
"""
_EPILOG_PLAN = """\
examples:
  tideserve plan --deployment chat-pd        # what the planner would do now, and why
  tideserve plan --deployment chat-pd --json
"""
_EPILOG_SCALE = """\
examples:
  tideserve scale deployment chat-pd --role decode --replicas 4   # now, and pinned there
  tideserve scale deployment chat-pd --role decode --release      # the planner decides again
  tideserve scale deployment chat-pd --role decode --replicas 4 --no-pin  # planner may move it
  tideserve scale deployment chat-pd --role decode --replicas 4 --json
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--autoscaler",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help=f"autoscaler gRPC address (default {DEFAULT_ADDRESS})",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=10.0, help="per call, seconds (default 10)")
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the local stack whose admin token to use for its autoscaler (default: settings)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    apply = subparsers.add_parser(
        "apply",
        help="create or update a deployment from a YAML spec",
        description="Apply a deployment spec (roles, SLO classes, P:D bounds, budget).",
        epilog=_EPILOG_APPLY,
        formatter_class=fmt,
    )
    apply.add_argument("-f", "--file", required=True, type=Path, help="spec YAML file")
    _common(apply)
    apply.set_defaults(func=_apply)

    get = kinds(subparsers, "get", "list resources", _EPILOG_GET)
    deployments = get.add_parser(
        "deployments",
        help="deployments with desired vs ready replicas",
        epilog=_EPILOG_GET,
        formatter_class=fmt,
    )
    _common(deployments)
    deployments.set_defaults(func=_get_deployments)

    describe = kinds(subparsers, "describe", "show one resource in detail", _EPILOG_DESCRIBE)
    deployment = describe.add_parser(
        "deployment",
        help="desired vs actual, instances, last decisions",
        epilog=_EPILOG_DESCRIBE,
        formatter_class=fmt,
    )
    deployment.add_argument("name", help="deployment name")
    deployment.add_argument("--decisions", type=int, default=5, help="how many (default 5)")
    _common(deployment)
    deployment.set_defaults(func=_describe)

    plan = subparsers.add_parser(
        "plan",
        help="what a running autoscaler would do now for a deployment, and why",
        description="Ask the autoscaler's planner for a decision without carrying it out. "
        "(To size a new deployment for a trace and SLOs, see tideserve recommend.)",
        epilog=_EPILOG_PLAN,
        formatter_class=fmt,
    )
    plan.add_argument("--deployment", required=True, help="deployment name")
    _common(plan)
    plan.set_defaults(func=_plan)

    scale = kinds(subparsers, "scale", "set replicas by hand", _EPILOG_SCALE)
    sd = scale.add_parser(
        "deployment",
        help="set a role's replicas now and pin them (the planner holds a pinned role)",
        description="Manual override: the role goes to --replicas now (drained scale-in) and "
        "every planner policy holds it there (a pin) until the next apply that changes the "
        "spec, or --release; --no-pin sets the count without pinning it.",
        epilog=_EPILOG_SCALE,
        formatter_class=fmt,
    )
    sd.add_argument("name", help="deployment name")
    sd.add_argument("--role", required=True, help="role name in the spec")
    how = sd.add_mutually_exclusive_group(required=True)
    how.add_argument("--replicas", type=int, help="replicas within the role's [min, max]")
    how.add_argument("--release", action="store_true", help="unpin: the planner decides again")
    sd.add_argument("--no-pin", action="store_true", help="set the count now without pinning it")
    _common(sd)
    sd.set_defaults(func=_scale)


# --------------------------------------------------------------------------- rendering


def _dict(msg: Message) -> dict[str, Any]:
    return MessageToDict(msg, preserving_proto_field_name=True)


def _decision_lines(d: autoscaler_pb2.ScalingDecision) -> list[str]:
    changes = ", ".join(f"{c.role} {c.from_replicas}->{c.to_replicas}" for c in d.changes)
    lines = [f"  [{d.status}] ts_ms={d.ts_ms} binding={d.binding_constraint or '-'}"]
    lines.append(f"    changes: {changes or 'none'}")
    if d.victims:
        lines.append(f"    victims (drained first): {', '.join(d.victims)}")
    lines.extend(f"    - {r}" for r in d.reasons)
    return lines


def render_get(rows: list[autoscaler_pb2.GetDeploymentResponse]) -> str:
    """``get deployments`` as a table: name, generation, role desired/ready(+starting)."""
    out = [f"{'NAME':<24} {'GEN':>4}  ROLES (desired/ready+starting)"]
    for r in rows:
        roles = "  ".join(
            f"{s.role}={s.desired}/{s.ready}" + (f"+{s.starting}" if s.starting else "")
            for s in r.roles
        )
        out.append(f"{r.spec.name:<24} {r.spec.generation:>4}  {roles}")
    return "\n".join(out)


def render_describe(r: autoscaler_pb2.GetDeploymentResponse) -> str:
    s = r.spec
    out = [
        f"Name:        {s.name}",
        f"Model:       {s.model or '-'}",
        f"Generation:  {s.generation}",
    ]
    if s.budget.max_replicas or s.budget.group:
        out.append(
            f"Budget:      {s.budget.max_replicas or 'unbounded'}"
            + (f" (group {s.budget.group}, priority {s.budget.priority})" if s.budget.group else "")
        )
    out.append("SLO classes:")
    out.extend(
        f"  {c.name}: ttft {c.ttft_ms:g} ms, tpot {c.tpot_ms:g} ms at p{c.percentile:g}"
        f" (priority {c.priority})"
        for c in s.slo_classes
    )
    out.append(
        f"{'ROLE':<12} {'KIND':<8} {'MIN':>4} {'MAX':>4} {'DESIRED':>8} {'READY':>6} "
        f"{'STARTING':>9} {'DRAINING':>9} {'FAILED':>7}"
    )
    kinds_by_name = {x.name: role_name(x.role) for x in s.roles}
    bounds = {x.name: (x.min_replicas, x.max_replicas) for x in s.roles}
    for st in r.roles:
        lo, hi = bounds.get(st.role, (0, 0))
        out.append(
            f"{st.role:<12} {kinds_by_name.get(st.role, ''):<8} {lo:>4} {hi:>4} {st.desired:>8} "
            f"{st.ready:>6} {st.starting:>9} {st.draining:>9} {st.failed:>7}"
        )
    out.append(f"Progress:    {r.progress or '-'}")
    out.append("Instances:")
    state = common_pb2.InstanceState.Name
    for i in r.instances:
        detail = i.labels.get("detail", "")
        out.append(
            f"  {i.instance_id}  {i.labels.get('role_name', '')}  "
            f"{state(i.state).removeprefix('INSTANCE_STATE_').lower()}  {i.endpoint.url or '-'}"
            + (f"  ({detail})" if detail else "")
        )
    if not r.instances:
        out.append("  none")
    out.append("Last decisions (newest first):")
    for d in r.recent_decisions:
        out.extend(_decision_lines(d))
    if not r.recent_decisions:
        out.append("  none")
    return "\n".join(out)


def render_plan(d: autoscaler_pb2.ScalingDecision) -> str:
    out = [f"Deployment {d.deployment} (generation {d.generation}): what the planner would do now"]
    out.extend(_decision_lines(d))
    forecast = json.loads(d.forecast_json or "{}")
    if forecast:
        out.append(
            f"  forecast: {forecast.get('predictor', forecast.get('policy'))}, error MAPE "
            f"{forecast.get('mape', 0):.1%} over {forecast.get('scored_buckets', 0)} buckets"
        )
    return "\n".join(out)


# --------------------------------------------------------------------------- calls


def _call(args: argparse.Namespace, fn: Callable[[Any], int]) -> int:
    from services.common.local.client import cli_security
    from services.common.security.channels import sync_channel
    from services.common.settings import SettingsError

    try:
        channel = sync_channel(args.autoscaler, cli_security(args.autoscaler, args.state_dir))
    except (SettingsError, ValueError) as exc:  # a bad TLS/auth setting or file
        print(f"tideserve: {exc}", file=sys.stderr)
        return 2
    try:
        with channel:
            return fn(autoscaler_pb2_grpc.AutoscalerServiceStub(channel))
    except grpc.RpcError as exc:
        code = exc.code()
        details = exc.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            print(
                f"tideserve: autoscaler at {args.autoscaler} unreachable: {details}",
                file=sys.stderr,
            )
        else:
            print(f"tideserve: {code.name}: {details}", file=sys.stderr)
        return 1


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True))


def _apply(args: argparse.Namespace) -> int:
    try:
        spec = load_spec_file(args.file.read_text(encoding="utf-8"))
    except OSError as exc:
        print(f"tideserve: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    except SpecError as exc:
        print(f"tideserve: {args.file}: invalid spec:\n{exc}", file=sys.stderr)
        return 1

    def run(stub: Any) -> int:
        resp = stub.ApplyDeployment(
            autoscaler_pb2.ApplyDeploymentRequest(spec=spec_to_proto(spec)), timeout=args.timeout
        )
        if args.json:
            _print_json(_dict(resp) | {"changed": resp.changed})
        else:
            what = "configured" if resp.changed else "unchanged"
            print(f"deployment {resp.spec.name} {what} (generation {resp.spec.generation})")
        return 0

    return _call(args, run)


def _get_deployments(args: argparse.Namespace) -> int:
    def run(stub: Any) -> int:
        listed = stub.ListDeployments(autoscaler_pb2.ListDeploymentsRequest(), timeout=args.timeout)
        rows = [
            stub.GetDeployment(
                autoscaler_pb2.GetDeploymentRequest(name=d.name), timeout=args.timeout
            )
            for d in listed.deployments
        ]
        if args.json:
            _print_json({"deployments": [_dict(r) for r in rows]})
        else:
            print(render_get(rows))
        return 0

    return _call(args, run)


def _describe(args: argparse.Namespace) -> int:
    def run(stub: Any) -> int:
        resp = stub.GetDeployment(
            autoscaler_pb2.GetDeploymentRequest(name=args.name), timeout=args.timeout
        )
        decisions = stub.ListDecisions(
            autoscaler_pb2.ListDecisionsRequest(deployment=args.name, limit=args.decisions),
            timeout=args.timeout,
        )
        del resp.recent_decisions[:]
        resp.recent_decisions.extend(decisions.decisions)
        if args.json:
            _print_json(_dict(resp))
        else:
            print(render_describe(resp))
        return 0

    return _call(args, run)


def _plan(args: argparse.Namespace) -> int:
    def run(stub: Any) -> int:
        resp = stub.Plan(
            autoscaler_pb2.PlanRequest(deployment=args.deployment), timeout=args.timeout
        )
        if args.json:
            _print_json(_dict(resp.decision))
        else:
            print(render_plan(resp.decision))
        return 0

    return _call(args, run)


def _scale(args: argparse.Namespace) -> int:
    if args.replicas is not None and args.replicas < 0:
        print(f"tideserve: --replicas must be >= 0, got {args.replicas}", file=sys.stderr)
        return 1

    def run(stub: Any) -> int:
        resp = stub.ScaleRole(
            autoscaler_pb2.ScaleRoleRequest(
                deployment=args.name, role=args.role, replicas=args.replicas or 0,
                pin=not args.no_pin, release=args.release,
            ),
            timeout=args.timeout,
        )  # fmt: skip
        if args.json:
            _print_json(_dict(resp.decision))
        else:
            print(f"deployment {args.name}:")
            print("\n".join(_decision_lines(resp.decision)))
        return 0 if resp.decision.status != "failed" else 1

    return _call(args, run)
