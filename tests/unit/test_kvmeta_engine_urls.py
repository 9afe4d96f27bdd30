"""Where kvmeta reaches an engine: configured URLs first, then what membership events said,
then a host:port id (services/kvmeta/engine_urls.py)."""

from __future__ import annotations

import pytest
from tideserve.v1 import common_pb2, events_pb2

from services.kvmeta.engine_urls import EngineUrls, engine_url

ADDED = events_pb2.MembershipEvent.KIND_ADDED
CHANGED = events_pb2.MembershipEvent.KIND_STATE_CHANGED
REMOVED = events_pb2.MembershipEvent.KIND_REMOVED
READY = common_pb2.INSTANCE_STATE_READY
STOPPED = common_pb2.INSTANCE_STATE_STOPPED
FAILED = common_pb2.INSTANCE_STATE_FAILED
DRAINING = common_pb2.INSTANCE_STATE_DRAINING


def event(
    kind: int,
    iid: str,
    url: str = "",
    state: int = READY,
) -> events_pb2.MembershipEvent:
    inst = common_pb2.Instance(
        instance_id=iid, deployment="d", state=state, endpoint=common_pb2.Endpoint(url=url)
    )
    return events_pb2.MembershipEvent(kind=kind, instance=inst)


E1 = "http://127.0.0.1:31001"
E1B = "http://10.0.0.7:8000"


@pytest.mark.parametrize(
    ("configured", "events", "instance", "want"),
    [
        ({}, [], "engine-1", None),
        ({}, [], "127.0.0.1:30001", "http://127.0.0.1:30001"),
        ({}, [event(ADDED, "engine-1", E1 + "/")], "engine-1", E1),
        ({}, [event(ADDED, "engine-1", E1), event(CHANGED, "engine-1", E1B)], "engine-1", E1B),
        ({}, [event(ADDED, "engine-1", E1), event(CHANGED, "engine-1", "", DRAINING)],
         "engine-1", E1),
        ({}, [event(ADDED, "engine-1", E1), event(REMOVED, "engine-1")], "engine-1", None),
        ({}, [event(ADDED, "engine-1", E1), event(CHANGED, "engine-1", E1, STOPPED)],
         "engine-1", None),
        ({}, [event(ADDED, "engine-1", E1), event(CHANGED, "engine-1", E1, FAILED)],
         "engine-1", None),
        ({"engine-1": E1B + "/"}, [event(ADDED, "engine-1", E1)], "engine-1", E1B),
        ({}, [event(ADDED, "", E1)], "", None),
        ({}, [event(ADDED, "127.0.0.1:30001", E1)], "127.0.0.1:30001", E1),
    ],
    ids=[
        "unknown-name", "host-port-id", "learnt", "address-changed", "event-without-url-keeps",
        "removed", "stopped", "failed", "configured-wins", "no-id-ignored",
        "learnt-over-host-port",
    ],
)  # fmt: skip
def test_engine_url(
    configured: dict[str, str],
    events: list[events_pb2.MembershipEvent],
    instance: str,
    want: str | None,
) -> None:
    urls = EngineUrls(configured)
    for e in events:
        urls.apply(e)
    assert engine_url(instance, urls) == want


def test_mapping_lists_both_sources_once() -> None:
    urls = EngineUrls({"a": "http://x:1", "b": "http://x:2"})
    urls.apply(event(ADDED, "b", "http://y:2"))
    urls.apply(event(ADDED, "c", "http://y:3"))
    assert dict(urls) == {"a": "http://x:1", "b": "http://x:2", "c": "http://y:3"}
    assert len(urls) == 3
