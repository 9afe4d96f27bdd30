"""gRPC security shared by every service and client: TLS and mutual TLS from files
(reloaded), token authentication with roles, message-size and list-length limits.

Settings: :mod:`.settings` (fields ``tls``, ``auth``, ``grpc_limits`` of every service's
settings). Servers: :mod:`.server` (used by ``services.common.server.serve``). Channels:
:mod:`.channels`. Who may call what: :mod:`.access` and each service's ``access.py`` table.
Redis ACL users and Postgres roles per service: :mod:`.stores`.
"""
