"""Who may call ``tideserve.v1.KVMetaService`` (services.common.security.access): index
writes (KV event ingest), segment mounts and object puts/removes need ``operator``; matches,
listings and replica lookups (which grant a read lease, the object store's read path) need
``read``. The Transfer Engine metadata HTTP endpoint's writes need ``operator`` too
(services.kvmeta.metadata_http)."""

from __future__ import annotations

from services.common.security.access import AccessTable, Role

__all__ = ["ACCESS", "METADATA_ACCESS"]

R, OP = Role.READ, Role.OPERATOR

ACCESS = AccessTable(
    "tideserve.v1.KVMetaService",
    {
        "MatchPrefix": R,
        "IngestEvents": OP,
        "ListIndexedInstances": R,
        "MountSegment": OP,
        "UnmountSegment": OP,
        "PutStart": OP,
        "PutEnd": OP,
        "PutRevoke": OP,
        "GetReplicaList": R,
        "Remove": OP,
        "Exist": R,
        "BatchPutStart": OP,
        "BatchPutEnd": OP,
        "BatchGetReplicaList": R,
        "StartSessionTurn": OP,
        "EndSessionTurn": OP,
        "SetSessionPlacement": OP,
        "EndAgentSession": OP,
        "GetAgentSession": R,
        "ListAgentSessions": R,
        "ListSessionHomes": R,
        "MigrateSessions": OP,
    },
)


METADATA_ACCESS = {
    "GET /metadata": R,
    "PUT /metadata": OP,
    "DELETE /metadata": OP,
}
"""The Transfer Engine metadata HTTP endpoint (``METHOD /path`` -> least role)."""
