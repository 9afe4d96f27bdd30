"""``tideserve up``: start the local stack, wait until it is SERVING, supervise, stop cleanly.

Order: check ports → embedded Postgres → embedded Redis → migrations → services (wait for
grpc.health SERVING) → the simulated engines as a deployment of the autoscaler (applied, then
wait until it lists them READY and every gateway replica routes to them; its local driver runs
them, see services.stack.deployment) → print endpoints → wait for SIGINT/SIGTERM or a service
dying (an engine dying is reported, the stack keeps running: the gateway routes around it; so
does a gateway replica while another replica of its group still runs, see
ChildSpec.replica_of) → stop children (SIGTERM, grace, SIGKILL; the autoscaler stops its
engines) → engines a killed autoscaler left → Redis → Postgres. Any failure part way stops
what was started and exits non-zero; the state file records every pid as soon as it exists
(and where the driver records its engines' pids) so ``tideserve down`` can clean up even
after ``up`` or the autoscaler was killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

from services.common.local.ports import tcp_accepts
from services.common.local.procs import Child, ProcRef, Supervisor, is_alive, log_tail
from services.common.local.recorded import stop_recorded
from services.common.local.spec import ChildSpec, PortClaim
from services.common.local.state import (
    ProcEntry,
    StackState,
    read_state,
    redact_url,
    remove_state,
    write_state,
)
from services.common.security.stores import without_credentials
from services.stack.announce import announcement
from services.stack.autoscaled import EngineOps, EnginesFailed, start_engines
from services.stack.control import recorded_engines
from services.stack.engines import ENGINE_KIND, ENGINE_REDIS_ENV, start_waves, stop_rank
from services.stack.health import Health, check_grpc_health, check_http_ready
from services.stack.infra import Infra, Server, default_infra
from services.stack.plan import SERVICE_NAMES
from services.stack.port_check import check_ports
from services.stack.restarter import Restarter
from services.stack.restarts import RestartPolicy
from services.stack.secure import StackSecrets, StoreUrls, child_store_env
from services.stack.signals import Signals, StartFailed, StopRequested, state_lock

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Infra",
    "StackRunner",
    "StartFailed",
    "UpOptions",
    "check_ports",
    "default_infra",
]

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
NO_RESTARTS = RestartPolicy(max_restarts=0)


@dataclass(frozen=True)
class UpOptions:
    state_dir: Path
    host: str = "127.0.0.1"
    postgres_url: str | None = None
    redis_url: str | None = None
    redis_port: int = 6380
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    json_output: bool = False
    migrate_services: tuple[str, ...] = SERVICE_NAMES
    probe_timeout_s: float = 2.0
    deployment: Mapping[str, Any] | None = None
    """The engines as a deployment spec (services.stack.deployment); None = no engines."""
    autoscaler_address: str = ""
    engine_claims: tuple[PortClaim, ...] = ()
    """The engines' planned ports (checked free before anything starts)."""
    engines_timeout_s: float | None = None
    """How long the engines get to be READY and routed (None: ``start_timeout_s``); real
    engines load a model first."""
    secrets: StackSecrets | None = None
    """Per-service store credentials on the embedded servers (services.stack.secure); the
    infra must have been built with the same (default_infra(secrets))."""
    stream_prefix: str = "ts"
    restarts: RestartPolicy = NO_RESTARTS
    """Restarts of a service that dies while the stack runs (default: none, it stops the
    stack; see services.stack.restarts)."""


class StackRunner:
    """One run of ``tideserve up``. ``children`` carry everything but the database URLs."""

    def __init__(
        self,
        opts: UpOptions,
        children: Sequence[ChildSpec],
        infra: Infra,
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
        probe: Callable[[str, str, float], Health] = check_grpc_health,
        http_probe: Callable[[str, float], Health] = check_http_ready,
        engine_ops: EngineOps | None = None,
    ) -> None:
        self.opts = opts
        self.children = tuple(children)
        self.infra = infra
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.probe = probe
        self.http_probe = http_probe
        self.engine_ops = engine_ops if engine_ops is not None else EngineOps()
        self.supervisor = Supervisor(stop_timeout_s=opts.stop_timeout_s, stop_rank=stop_rank)
        self.signals = Signals()
        me = ProcRef.of("up", os.getpid())
        self.state = StackState(
            up=ProcEntry("up", me.pid, me.create_time, kind="up"),
            state_dir=str(opts.state_dir),
        )
        self._infra_refs: list[ProcRef] = []
        self._reported_dead: set[str] = set()
        self.restarter = Restarter(opts.restarts, self.supervisor, self._say, self._record_restart)

    # ----------------------------------------------------------------- helpers
    def _say(self, msg: str) -> None:
        print(f"tideserve up: {msg}", file=self.err, flush=True)

    def _save(self) -> None:
        write_state(self.opts.state_dir, self.state)

    def _record(self, entry: ProcEntry) -> None:
        self.state.processes.append(entry)
        self._save()

    def _claims(self) -> list[PortClaim]:
        claims = [c for child in self.children for c in child.ports]
        claims += self.opts.engine_claims
        if self.opts.redis_url is None:
            claims.insert(0, PortClaim("redis", "embedded", self.opts.host, self.opts.redis_port))
        return claims

    # ----------------------------------------------------------------- run
    def run(self) -> int:
        """Run until stopped: 0 after a requested stop (also during start-up), 1 when something
        failed (ports, a server, a migration, a child); everything started is stopped first."""
        try:
            with state_lock(self.opts.state_dir):
                return self._run_locked()
        except StartFailed as exc:
            self._say(str(exc))
            return EXIT_FAILED

    def _run_locked(self) -> int:
        self._refuse_if_running()
        check_ports(self._claims())
        rc = EXIT_FAILED
        with self.signals.installed(), contextlib.ExitStack() as teardown:
            try:
                self._save()  # from now on `tideserve down` can reach us
                urls = self._start_infra(teardown)
                teardown.callback(self._stop_children)
                for wave in start_waves(self.children):
                    started = self._start_children(wave, urls)
                    self._wait_serving(started)
                self._start_engines()
                self._announce()
                rc = self._supervise()
            except StopRequested as exc:
                self._say(f"{exc} received before the stack was ready; stopping")
                rc = EXIT_OK
            except StartFailed as exc:
                self._say(str(exc))
                rc = EXIT_FAILED
            finally:
                self.state.phase = "stopping"
                self._save()
        self._finish()
        return rc

    def _refuse_if_running(self) -> None:
        try:
            old = read_state(self.opts.state_dir)
        except ValueError as exc:
            raise StartFailed(f"cannot read the state file: {exc}") from exc
        if old is None:
            return
        try:
            engines = recorded_engines(old)
        except ValueError as exc:
            raise StartFailed(f"cannot read the engine record: {exc}") from exc
        alive = [p.name for p in [old.up, *old.processes, *engines] if is_alive(p.ref)]
        if alive:
            raise StartFailed(
                f"a stack from {self.opts.state_dir} is still running ({', '.join(alive)}); "
                "run `tideserve down` first"
            )
        remove_state(self.opts.state_dir)

    def _start_infra(self, teardown: contextlib.ExitStack) -> StoreUrls:
        opts = self.opts
        postgres_url = opts.postgres_url
        if postgres_url is None:
            self._say(f"starting embedded PostgreSQL in {opts.state_dir / 'postgres'}")
            pg = self._guarded(
                "embedded PostgreSQL", self.infra.start_postgres, opts.state_dir / "postgres"
            )
            teardown.callback(self._stop_server, "PostgreSQL", pg)
            postgres_url = pg.url
            ref = ProcRef.of("postgres", pg.pid)
            self._infra_refs.append(ref)
            self._record(
                ProcEntry("postgres", ref.pid, ref.create_time, kind="postgres", url=pg.url)
            )
        else:
            self._guarded("external PostgreSQL", self.infra.check_postgres, postgres_url)
        self.state.postgres_url = redact_url(postgres_url)
        redis_url = opts.redis_url
        if redis_url is None:
            self._say(f"starting embedded Redis on {opts.host}:{opts.redis_port}")
            rd = self._guarded(
                "embedded Redis", self.infra.start_redis, opts.state_dir / "redis", opts.redis_port
            )
            teardown.callback(self._stop_server, "Redis", rd)
            redis_url = rd.url
            ref = ProcRef.of("redis", rd.pid)
            self._infra_refs.append(ref)
            url = without_credentials(rd.url)  # the admin password stays out of the state file
            self._record(ProcEntry("redis", ref.pid, ref.create_time, kind="redis", url=url))
        else:
            self._guarded("external Redis", self.infra.check_redis, redis_url)
        self.state.redis_url = redact_url(redis_url)
        self._save()
        urls = StoreUrls(postgres_url, redis_url, opts.postgres_url is None, opts.redis_url is None)
        for service in opts.migrate_services:
            self._say(f"migrating {service}")
            own = child_store_env(opts.secrets, urls, service, None)["TIDESERVE_POSTGRES_URL"]
            self._guarded(f"migration of {service}", self.infra.migrate, own, service)
        return urls

    def _guarded(self, what: str, fn: Callable[..., T], *args: object) -> T:
        """Run one start-up step after honouring a pending stop (not after it: the caller must
        first register the cleanup of what the step started)."""
        self.signals.checkpoint()
        try:
            result = fn(*args)
        except (StopRequested, StartFailed):
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StartFailed(f"{what} failed: {first}") from exc
        return result

    def _stop_server(self, what: str, server: Server) -> None:
        self._say(f"stopping {what}")
        try:
            server.stop()
        except Exception as exc:
            self._say(f"stopping {what} failed: {exc}")

    def _start_children(self, specs: Sequence[ChildSpec], urls: StoreUrls) -> list[Child]:
        started = []
        for spec in specs:
            engine = spec.kind == ENGINE_KIND
            service = None if engine else (spec.replica_of or spec.name)
            # the autoscaler's engines inherit their Redis URL from it
            starts_engines = spec.name == "autoscaler" and self.opts.deployment is not None
            engine_env = ENGINE_REDIS_ENV if engine or starts_engines else None
            extra = child_store_env(self.opts.secrets, urls, service, engine_env)
            spec = dataclasses.replace(spec, env={**spec.env, **extra})
            self._say(f"starting {spec.name}")
            child = self._guarded(f"starting {spec.name}", self.supervisor.start, spec)
            started.append(child)
            engine = spec.kind == ENGINE_KIND and bool(spec.ports)
            self._record(
                ProcEntry(
                    spec.name,
                    child.ref.pid,
                    child.ref.create_time,
                    kind=spec.kind,
                    grpc_address=spec.grpc_address,
                    grpc_service=spec.grpc_service,
                    log=str(spec.log_path),
                    url=spec.ports[0].url() if engine else None,
                    ready_url=spec.ready_url,
                    role=spec.ports[0].purpose if engine else "",
                )
            )
        return started

    def _start_engines(self) -> None:
        """Apply the engines' deployment and wait for them (see services.stack.autoscaled)."""
        spec = self.opts.deployment
        if spec is None:
            return
        self.state.engine_dir = str(self.opts.state_dir)  # from now on `down` finds them
        self._save()
        gateways = [
            c.grpc_address
            for c in self.children
            if "scheduler" in (c.name, c.replica_of) and c.grpc_address is not None
        ]
        self._say(f"starting the engines: deployment {spec['name']} on the autoscaler")
        self.signals.checkpoint()
        try:
            views = start_engines(
                self.engine_ops,
                autoscaler=self.opts.autoscaler_address,
                gateways=gateways,
                spec=spec,
                timeout_s=self.opts.engines_timeout_s or self.opts.start_timeout_s,
                rpc_timeout_s=self.opts.probe_timeout_s,
                pause=self._pause,
                clock=time.monotonic,
            )
        except EnginesFailed as exc:
            raise StartFailed(f"{exc} (logs in {self.opts.state_dir / 'logs'})") from exc
        for v in views:
            self._say(f"{v.instance_id} is READY on {v.url}")

    def _pause(self, seconds: float) -> None:
        self.signals.checkpoint()
        self.signals.event.wait(seconds)
        self.signals.checkpoint()

    def _died(self, child: Child, code: int) -> StartFailed:
        tail = log_tail(child.spec.log_path, 5)
        last = tail.splitlines()[-1] if tail else "(empty log)"
        return StartFailed(
            f"{child.spec.name} exited with code {code}: {last} (log: {child.spec.log_path})"
        )

    def _wait_serving(self, children: Sequence[Child]) -> None:
        deadline = time.monotonic() + self.opts.start_timeout_s
        pending = {c.spec.name: c for c in children}
        last: dict[str, Health] = {}
        while pending:
            for name, child in list(pending.items()):
                code = child.exit_code()
                if code is not None:
                    raise self._died(child, code)
                target = child.spec.grpc_address or child.spec.ready_url
                if target is None:
                    del pending[name]
                    continue
                if child.spec.grpc_address is not None:
                    health = self.probe(target, "", self.opts.probe_timeout_s)
                else:
                    health = self.http_probe(target, self.opts.probe_timeout_s)
                last[name] = health
                if health is Health.SERVING:
                    self._say(f"{name} is SERVING on {target}")
                    del pending[name]
            if not pending:
                return
            self.signals.checkpoint()
            if time.monotonic() > deadline:
                what = ", ".join(
                    f"{n} {last.get(n, Health.UNREACHABLE).value}" for n in sorted(pending)
                )
                raise StartFailed(
                    f"not SERVING within {self.opts.start_timeout_s:g}s: {what} "
                    f"(logs in {self.opts.state_dir / 'logs'})"
                )
            self.signals.event.wait(0.2)

    def _announce(self) -> None:
        """Record the endpoints, then mark the stack running (so a reader that sees "running"
        also sees every endpoint), then print them. HTTP endpoints (metrics, gateway, ...) are
        listed only when something accepts connections on them: nothing is printed that is not
        there."""
        by_name = {c.spec.name: c for c in self.supervisor.children}
        for entry in self.state.processes:
            child = by_name.get(entry.name)
            if child is None:
                continue
            for claim in child.spec.ports:
                url = claim.url()
                if url is not None and tcp_accepts(claim.host, claim.port):
                    entry.endpoints[claim.purpose] = url
            if entry.kind == ENGINE_KIND and entry.url is not None:
                entry.endpoints["metrics"] = entry.url.rstrip("/") + "/metrics"
            entry.metrics_url = entry.endpoints.get("metrics")
            if self.state.gateway_url is None and "gateway" in entry.endpoints:
                self.state.gateway_url = entry.endpoints["gateway"]
        self.state.phase = "running"
        self._save()
        engines = self._engines()
        if self.opts.json_output:
            doc = {**self.state.to_json(), "engines": [dataclasses.asdict(e) for e in engines]}
            print(json.dumps(doc), file=self.out, flush=True)
            return
        print(announcement(self.state, engines, self.opts), file=self.out, flush=True)

    def _engines(self) -> list[ProcEntry]:
        """The engines the autoscaler's driver recorded ([] when unreadable: said once)."""
        try:
            return recorded_engines(self.state)
        except ValueError as exc:
            if "engine-record" not in self._reported_dead:
                self._reported_dead.add("engine-record")
                self._say(f"cannot read the engine record: {exc}")
            return []

    def _supervise(self) -> int:
        while not self.signals.event.wait(0.5):
            for engine in self._engines():
                if engine.name not in self._reported_dead and not is_alive(engine.ref):
                    self._reported_dead.add(engine.name)
                    self._say(
                        f"{engine.name} (pid {engine.pid}) is gone (log: {engine.log}); "
                        "the stack keeps running without it"
                    )
            for child, code in self.supervisor.exited():
                if child.spec.kind != ENGINE_KIND and self.restarter.plan(
                    child, str(self._died(child, code))
                ):
                    continue
                if child.spec.kind != ENGINE_KIND and not self._replica_left(child):
                    self._say(str(self._died(child, code)) + "; stopping the stack")
                    return EXIT_FAILED
                if child.spec.name not in self._reported_dead:
                    self._reported_dead.add(child.spec.name)
                    self._say(str(self._died(child, code)) + "; the stack keeps running without it")
            for ref in self._infra_refs:
                if not is_alive(ref):
                    self._say(f"{ref.name} (pid {ref.pid}) is gone; stopping the stack")
                    return EXIT_FAILED
            self.restarter.start_due()
        self._say("stop requested; stopping")
        return EXIT_OK

    def _record_restart(self, new: Child) -> None:
        for i, entry in enumerate(self.state.processes):
            if entry.name == new.spec.name:
                self.state.processes[i] = dataclasses.replace(
                    entry, pid=new.ref.pid, create_time=new.ref.create_time
                )
        self._save()

    def _replica_left(self, dead: Child) -> bool:
        """True when another replica of ``dead``'s group (ChildSpec.replica_of) still runs."""
        group = dead.spec.replica_of
        return bool(group) and any(
            c.spec.replica_of == group and c is not dead and c.exit_code() is None
            for c in self.supervisor.children
        )

    def _stop_children(self) -> None:
        if self.supervisor.children:
            self._say("stopping services")
            killed = self.supervisor.stop_all()
            if killed:
                self._say(f"killed after {self.opts.stop_timeout_s:g}s: {', '.join(killed)}")
        if self.state.engine_dir is not None:  # the autoscaler stops its engines; if killed:
            try:
                left, _ = stop_recorded(Path(self.state.engine_dir), self.opts.stop_timeout_s)
            except ValueError as exc:
                self._say(f"cannot read the engine record: {exc}")
                return
            if left:
                self._say(f"stopped engines the autoscaler left running: {', '.join(left)}")

    def _finish(self) -> None:
        try:
            engines = recorded_engines(self.state)
        except ValueError:
            engines = []
        left = [p for p in [*self.state.processes, *engines] if is_alive(p.ref)]
        if left:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in left)
            self._say(f"still running after stop: {names}; the state file is kept")
            return
        remove_state(self.opts.state_dir)
        self._say("stopped")
