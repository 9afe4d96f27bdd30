"""The pure parts of gRPC security: who may call what, tokens files, list bounds, and that
every service's access table covers exactly its RPCs."""

from __future__ import annotations

import grpc
import pytest
from tideserve.v1 import (
    autoscaler_pb2,
    events_pb2,
    kvmeta_pb2,
    scheduler_pb2,
    telemetry_pb2,
)

from services.autoscaler.access import ACCESS as AUTOSCALER
from services.common.security.access import AccessTable, Role, decide, policy_of
from services.common.security.limits import ListBounds, overlong_field
from services.common.security.tokens import (
    format_entry,
    hash_token,
    lookup,
    new_token,
    parse_tokens,
)
from services.kvmeta.access import ACCESS as KVMETA
from services.scheduler.access import ACCESS as SCHEDULER
from services.telemetry.access import ACCESS as TELEMETRY

TABLE = AccessTable("t.S", {"Read": Role.READ, "Write": Role.OPERATOR, "Nuke": Role.ADMIN})
POLICY = policy_of([TABLE], reflection=False)
OK = None
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED

CASES = [
    # method, role, token_given, open_reads, expected
    ("/t.S/Read", None, False, False, UNAUTH),
    ("/t.S/Read", None, True, False, UNAUTH),
    ("/t.S/Read", None, False, True, OK),
    ("/t.S/Read", Role.READ, True, False, OK),
    ("/t.S/Write", None, False, True, UNAUTH),
    ("/t.S/Write", Role.READ, True, True, DENIED),
    ("/t.S/Write", Role.OPERATOR, True, False, OK),
    ("/t.S/Write", Role.ADMIN, True, False, OK),
    ("/t.S/Nuke", Role.OPERATOR, True, False, DENIED),
    ("/t.S/Nuke", Role.ADMIN, True, False, OK),
    ("/t.S/NotInTable", Role.ADMIN, True, True, DENIED),
    ("/grpc.health.v1.Health/Check", None, False, False, OK),
    (
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        Role.ADMIN,
        True,
        False,
        DENIED,
    ),
]


@pytest.mark.parametrize(
    ("method", "role", "given", "open_reads", "expected"),
    CASES,
    ids=[f"{c[0].rsplit('/', 1)[1]}-{c[1].label if c[1] else 'none'}-open{c[3]}" for c in CASES],
)
def test_decide(
    method: str, role: Role | None, given: bool, open_reads: bool, expected: object
) -> None:
    got = decide(POLICY, method, role, token_given=given, open_reads=open_reads, who="t")
    assert (got.code if got is not None else None) == expected
    if got is not None:
        assert method in got.message


def test_reflection_is_a_read_when_served() -> None:
    policy = policy_of([TABLE], reflection=True)
    method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    assert decide(policy, method, Role.READ, token_given=True, open_reads=False) is None


def test_tokens_round_trip_and_constant_time_lookup() -> None:
    op, ro = new_token(), new_token()
    assert op != ro and len(op) >= 40
    text = "# stack tokens\n\n" + format_entry("ops", Role.OPERATOR, op) + "\n"
    text += format_entry("viewer", Role.READ, ro) + "  # the dashboard\n"
    entries = parse_tokens(text)
    assert [(e.name, e.role) for e in entries] == [("ops", Role.OPERATOR), ("viewer", Role.READ)]
    assert op not in text  # only hashes at rest
    found = lookup(entries, op)
    assert found is not None and found.name == "ops"
    assert lookup(entries, ro + "x") is None
    assert lookup(entries, "") is None


BAD_FILES = [
    ("a operator", "expected 'NAME ROLE sha256:HEX'"),
    ("a operator md5:00", "expected 'NAME ROLE sha256:HEX'"),
    ("a operator sha256:zz", "not hex"),
    ("a operator sha256:00ff", "64 hex digits"),
    (f"a root {hash_token('x')}", "unknown role 'root'"),
    (f"a admin {hash_token('x')}\na read {hash_token('y')}", "line 2: token name 'a' twice"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_bad_tokens_file_names_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="line") as err:
        parse_tokens(text)
    assert message in str(err.value)


def _record(scores: int) -> events_pb2.RequestRecord:
    return events_pb2.RequestRecord(
        request_id="r", scores=[events_pb2.PluginScore(plugin="p") for _ in range(scores)]
    )


LIST_CASES = [
    ("under", _record(3), ListBounds(3, {}), None),
    ("over", _record(4), ListBounds(3, {}), "scores"),
    (
        "per-field bound wins",
        _record(4),
        ListBounds(3, {"tideserve.v1.RequestRecord.scores": 10}),
        None,
    ),
    (
        "empty lists pass a zero bound",
        kvmeta_pb2.IngestEventsResponse(),
        ListBounds(0, {}),
        None,
    ),
    (
        "packed scalars",
        kvmeta_pb2.MatchPrefixRequest(deployment="d", block_hashes=list(range(5))),
        ListBounds(4, {}),
        "block_hashes",
    ),
]


@pytest.mark.parametrize(
    ("msg", "bounds", "field"), [c[1:] for c in LIST_CASES], ids=[c[0] for c in LIST_CASES]
)
def test_overlong_field(msg: object, bounds: ListBounds, field: str | None) -> None:
    found = overlong_field(msg, bounds)  # type: ignore[arg-type]
    assert (found.path if found is not None else None) == field
    if found is not None:
        assert field in found.message() and str(bounds.default) in found.message()


def test_overlong_field_walks_into_nested_messages() -> None:
    batch = events_pb2.KVEventBatch(
        events=[events_pb2.KVEvent(block_hashes=[1]), events_pb2.KVEvent(block_hashes=[1, 2, 3])]
    )
    found = overlong_field(batch, ListBounds(2, {}))
    assert found is not None and found.path == "events[1].block_hashes"
    assert found.field == "tideserve.v1.KVEvent.block_hashes"


MODULES = {
    "scheduler": (SCHEDULER, scheduler_pb2),
    "kvmeta": (KVMETA, kvmeta_pb2),
    "autoscaler": (AUTOSCALER, autoscaler_pb2),
    "telemetry": (TELEMETRY, telemetry_pb2),
}


@pytest.mark.parametrize("service", list(MODULES), ids=list(MODULES))
def test_every_rpc_of_every_service_is_in_its_table(service: str) -> None:
    table, module = MODULES[service]
    name = table.service.rsplit(".", 1)[1]
    rpcs = {m.name for m in module.DESCRIPTOR.services_by_name[name].methods}
    assert set(table.methods) == rpcs


STATE_CHANGING = [
    ("autoscaler", "ApplyDeployment"),
    ("autoscaler", "ScaleRole"),
    ("autoscaler", "DeleteDeployment"),
    ("scheduler", "Drain"),
    ("scheduler", "Undrain"),
    ("kvmeta", "IngestEvents"),
    ("kvmeta", "MountSegment"),
    ("kvmeta", "PutStart"),
    ("kvmeta", "BatchPutEnd"),
    ("kvmeta", "Remove"),
    ("telemetry", "ReportRecords"),
]


@pytest.mark.parametrize(("service", "rpc"), STATE_CHANGING, ids=[r for _, r in STATE_CHANGING])
def test_state_changing_rpcs_need_operator(service: str, rpc: str) -> None:
    assert MODULES[service][0].methods[rpc] >= Role.OPERATOR
