"""The help texts (examples and notes) of ``tideserve up``, ``down`` and ``status``."""

__all__ = ["DOWN_EXAMPLES", "STATUS_EXAMPLES", "UP_EXAMPLES"]

UP_EXAMPLES = """\
examples:
  tideserve up                                  # embedded Postgres + Redis, default ports,
                                                # two simulated engines (--engines 0: none)
  tideserve up --state-dir /tmp/ts --base-port-offset 100
  tideserve up --postgres-url postgresql://u:p@db:5432/ts --redis-url redis://cache:6379/0
  tideserve up --config tideserve.yaml --json   # print the endpoints as JSON once SERVING

  # with simulated engines behind the gateway (http://127.0.0.1:8000/v1)
  tideserve up --engines 4                      # four aggregated engines on 30001-30004
  tideserve up --prefill 1 --decode 2           # P/D: SGLang-style bootstrap hand-off
  tideserve up --engines 4 --engine-profile test --engine-speedup 10 --engine-kv-blocks 4096
  tideserve up --engines 2 --engine-arg=--max-batch=32 --engine-arg "--stream-interval 4"

  # real engines serving a model directory, each with its kv-bridge (docs/real-engines.md)
  tideserve up --engine vllm --model-path /models/llama --engines 2
  tideserve up --engine sglang --model-path /models/qwen --engine-arg "--tp-size 2"

  # active-active: 2 gateway replicas (scheduler, scheduler-2) behind one address
  tideserve up --engines 3 --gateways 2
  tideserve up --gateways 1                     # one gateway process (default: one per core)

Ports (before --base-port-offset): gRPC scheduler 50051, kvmeta 50052, autoscaler 50053,
telemetry 50054; metrics 9101-9104; gateway HTTP 8000; kvmeta TE metadata HTTP 8081;
embedded Redis 6380; engines 30001 upward. Per-service keys in the config file
(`kvmeta: {grpc_port: N}`, `metrics_port`, `http_port`, `metadata_http_port`) and
`stack: {redis_port: N}` override them. Only endpoints that answer are printed.
Engines: a deployment of the stack's autoscaler (named after the scheduler's deployment;
roles engine or prefill/decode), applied once the services are SERVING and run by its local
driver as `tideserve engine` processes engine-1, prefill-1, ... (restart policy never), with
the stack's Redis and the scheduler's block_size; `up` waits until the autoscaler lists them
READY and every gateway routes to them (membership; the scheduler's `endpoints` setting is
emptied). More engines: `tideserve apply -f` the deployment with higher replicas and
min_replicas. `stack:` keys engines, prefill, decode, engine_profile, engine_speedup,
engine_kv_blocks, engine_args, engine_base_port and engine_ports (explicit list, no offset)
set the same from the config file. P/D engines move real KV bytes in the hand-off
(`--kv-data-plane` on kvmeta's TE metadata endpoint, opened to them without a token in the
secured stack: keep that port local). An engine that dies is reported and the stack keeps running
(the gateway routes around it); `down` stops the engines, also those of a killed autoscaler
(pids recorded in <state-dir>/instances.json).
Gateways: `--gateways N|auto` (or `stack: {gateways: N}`; default auto = one per usable core,
as one gateway process saturates one core) runs N scheduler replicas, `scheduler`,
`scheduler-2`, ..., all listening on the one gateway HTTP port (SO_REUSEPORT: the kernel
spreads new connections over the live replicas) and sharing routed prefixes and in-flight
load through Redis (share_state; replica_id = the name; responses carry x-tideserve-replica).
Replica k has the scheduler's gRPC and metrics ports + k*100 (`stack: {gateway_port_step}`;
explicit gRPC ports: `stack: {gateway_grpc_ports: [...]}`). A replica that dies is reported
and the stack keeps running while another one lives.
Security (README "Security"): every gRPC call but health checks needs a token (the CLI
sends <state-dir>/secrets/admin.token to this stack's addresses); the embedded Redis and
Postgres give each service its own ACL user and role. --insecure (`stack: {secure: false}`)
runs the stack open, as before.
Logs: <state-dir>/logs/<service>.log. Ctrl-C or `tideserve down` stops everything.
"""

DOWN_EXAMPLES = """\
examples:
  tideserve down                      # stop the stack started by `tideserve up`
  tideserve down --state-dir /tmp/ts  # the stack whose state lives in /tmp/ts
"""

STATUS_EXAMPLES = """\
examples:
  tideserve status
  tideserve status --state-dir /tmp/ts --json

Exit code 0 only when every service answers grpc.health SERVING and every engine of the
stack answers GET /health with 200.
"""
