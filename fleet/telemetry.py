"""Job telemetry: what this process has done, read when a monitor asks.

The counters live where the work is counted, as plain integers under locks that exist
anyway, so training pays nothing for them:

- a worker's examples and steps: the global ``Scope`` (``trained_examples``,
  ``trained_steps``; the executor counts each batch);
- requests, replies and bytes on the wire, per operation: the transport clients
  (``fleet.transport.counters.WIRE``);
- the async send queues and staleness: the communicator (``send_queue_depths``,
  ``steps_in_flight``; GEO: ``steps_since_exchange``); heartbeat ages: the worker's
  ``Heartbeat``;
- a server's requests per operation and parked waits: its ``ParameterServer``
  (``op_requests``, ``parked_counts``); bytes in and out, heartbeats and when each worker
  was last heard: its ``ServerSocket``; rows and memory: its tables.

``snapshot()`` gathers them into one dict for this process, with rates per second over
the last ~10 s (from the samples earlier snapshots took; the first one measures from when
``fleet.init`` described the process). With ``FLEET_METRICS_PORT`` set, ``fleet.init``
serves them over HTTP in the Prometheus text format (``prometheus_client``, a collector
that calls ``snapshot()`` at each scrape), labelled with the process's role, index and
endpoint. ``scrape`` and ``parse_metrics`` read such an endpoint back (fleetrun's
``--live_summary``).

Thread-safety: every function may be called from any thread; a snapshot never blocks on
anything but the short locks of the counters and tables it reads.
"""
import collections
import errno
import math
import threading
import time
import urllib.error
import urllib.request

from fleet.endpoints import join_endpoint, split_endpoint
from fleet.envvars import parse_int
from fleet.errors import ConfigError, TransportError
from fleet.transport.counters import WIRE
from fleet.transport.settings import bind_host

METRICS_PORT_ENV = "FLEET_METRICS_PORT"
RATE_WINDOW_S = 10.0
PUSH_OPS = ("push", "sync_push", "geo_push")
PULL_OPS = ("pull_dense", "pull_sparse")
_SOCKET_OPS = ("heartbeat", "ping")  # answered by a server's socket, not its handler


class _Rates:
    """Per-second rates of counters over the last ~``window`` seconds, from samples that
    successive snapshots take (nothing runs in between)."""

    def __init__(self, window=RATE_WINDOW_S, start=None):
        self.window = window
        self._samples = collections.deque([(time.monotonic() if start is None else start, {})])
        self._lock = threading.Lock()

    def rates(self, values, now=None):
        """Records ``values`` (counter -> total) and returns counter -> per second since
        the newest sample at least ``window`` old (else the oldest one)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            samples = self._samples
            while len(samples) > 1 and samples[1][0] <= now - self.window:
                samples.popleft()
            t0, ref = samples[0]
            samples.append((now, dict(values)))
        span = now - t0
        if span <= 0:
            return dict.fromkeys(values, 0.0)
        return {k: max(0.0, (v - ref.get(k, 0)) / span) for k, v in values.items()}


class ProcessTelemetry:
    """The telemetry of one process: who it is and the runtime whose counters it reads."""

    def __init__(self, scope=None, wire=None):
        self.role, self.index, self.endpoint = "worker", 0, ""
        self.scope = scope  # the Scope whose training is counted (None: the global scope)
        self.wire = WIRE if wire is None else wire
        self._rates = _Rates()
        self.worker = None  # the WorkerRuntime (fleet.runtime), once minimize built it
        self.server = None  # the ServerRuntime
        self._lock = threading.Lock()

    def describe(self, role, index, endpoint):
        """Sets the labels of this process and starts its rates afresh."""
        with self._lock:
            self.role, self.index, self.endpoint = role, int(index), endpoint or ""
            self.worker = self.server = None
            self._rates = _Rates()

    def attach_worker(self, runtime):
        """Reads a worker's counters from ``runtime`` (``comm``, ``heartbeat``, ``started``)."""
        self.worker, self.server = runtime, None

    def attach_server(self, runtime):
        """Reads a server's counters from ``runtime`` (``server``, ``sock``)."""
        self.server, self.worker = runtime, None

    def snapshot(self):
        """This process's counters as a dict (see the module docstring). Never blocks for
        long: only the counters' and tables' own locks."""
        out = {"role": self.role, "index": self.index, "endpoint": self.endpoint}
        if self.role == "server":
            out["server"] = self._server_snapshot()
        else:
            out["worker"] = self._worker_snapshot()
        return out

    # ------------------------------------------------------------------ worker
    def _worker_snapshot(self):
        scope = self.scope
        if scope is None:
            from fleet.framework.scope import global_scope  # imported late: fleetrun imports this module

            scope = global_scope()
        wire = self.wire.snapshot()
        totals = {
            "examples": scope.trained_examples,
            "steps": scope.trained_steps,
            "pushes": sum(wire[op]["requests"] for op in PUSH_OPS if op in wire),
            "pulls": sum(wire[op]["requests"] for op in PULL_OPS if op in wire),
            "sent_bytes": sum(row["sent_bytes"] for row in wire.values()),
            "received_bytes": sum(row["received_bytes"] for row in wire.values()),
        }
        rates = self._rates.rates(totals)
        out = dict(totals)
        out.update({f"{k}_per_second": rates[k] for k in ("examples", "steps", "pushes", "pulls")})
        out["requests"] = {op: row["requests"] for op, row in wire.items() if op != "stale"}
        runtime = self.worker
        comm = getattr(runtime, "comm", None)
        out["mode"] = getattr(comm, "mode", None) or "local"
        depths = comm.send_queue_depths() if hasattr(comm, "send_queue_depths") else {}
        out["send_queue_depth"] = depths
        out["send_queue_capacity"] = int(getattr(comm, "queue_size", 0)) if depths else 0
        if hasattr(comm, "steps_in_flight"):
            out["staleness_steps"] = comm.steps_in_flight()
        elif hasattr(comm, "steps_since_exchange"):
            out["staleness_steps"] = comm.steps_since_exchange()
        else:
            out["staleness_steps"] = None  # sync, half-async: every step waits for the servers
        started = runtime is not None and getattr(runtime, "started", False)
        out["heartbeat_age_seconds"] = runtime.heartbeat.last_replies() if started else {}
        return out

    # ------------------------------------------------------------------ server
    def _server_snapshot(self):
        runtime = self.server
        ps = getattr(runtime, "server", None)
        sock = getattr(runtime, "sock", None)
        stats = sock.stats() if sock is not None else {}
        requests = dict(ps.op_requests) if ps is not None else {}
        requests["heartbeat"] = stats.get("heartbeats", 0)
        requests["ping"] = stats.get("pings", 0)
        totals = {f"requests:{op}": n for op, n in requests.items()}
        totals["received_bytes"] = stats.get("received_bytes", 0)
        totals["sent_bytes"] = stats.get("sent_bytes", 0)
        rates = self._rates.rates(totals)
        out = {
            "requests": requests,
            "requests_per_second": {op: rates[f"requests:{op}"] for op in requests},
            "received_bytes": totals["received_bytes"],
            "sent_bytes": totals["sent_bytes"],
            "tables": _tables(ps) if ps is not None else {},
            "parked": ps.parked_counts() if ps is not None else {"sync": 0, "barrier": 0, "exchange": 0},
            "workers": ps.workers if ps is not None else 0,
            "workers_lost": len(ps.lost) if ps is not None else 0,
            "workers_stopped": len(ps.stopped) if ps is not None else 0,
        }
        now = time.monotonic()
        heard = sock.last_heard() if sock is not None else {}
        out["heartbeat_age_seconds"] = {w: now - t for w, t in sorted(heard.items())}
        return out


def _tables(ps):
    """{parameter: {"kind", "rows", "elements", "bytes"}} of what server ``ps`` holds: its
    blocks of dense and is_sparse parameters, its shard of each distributed table."""
    out = {}
    for pplan, _, table in list(ps.blocks.values()):
        shape = table.shape
        entry = out.setdefault(pplan.name, {"kind": pplan.kind, "rows": 0, "elements": 0, "bytes": 0})
        entry["rows"] += int(shape[0]) if shape else 1
        entry["elements"] += int(math.prod(shape))
        entry["bytes"] += int(table.memory_bytes())
    for name, (pplan, table) in list(ps.shards.items()):
        rows = len(table)
        out[name] = {"kind": pplan.kind, "rows": rows, "elements": rows * table.dim,
                     "bytes": int(table.memory_bytes())}
    return out


TELEMETRY = ProcessTelemetry()


def snapshot():
    """The counters of this process as a dict: ``role``, ``index``, ``endpoint`` and a
    ``worker`` or ``server`` dict (module docstring; ``docs/env.md`` lists the metrics)."""
    return TELEMETRY.snapshot()


# ---------------------------------------------------------------------- Prometheus

def _families(snap):
    """prometheus_client metric families of a snapshot."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    base = {"role": snap["role"], "index": str(snap["index"]), "endpoint": snap["endpoint"]}
    names = list(base)
    out = []

    def counter(name, doc, value):
        out.append(_one(CounterMetricFamily, name, doc, names, base, value))

    def gauge(name, doc, value):
        out.append(_one(GaugeMetricFamily, name, doc, names, base, value))

    def labelled(kind, name, doc, label, mapping):
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = cls(name, doc, labels=names + [label])
        for key, value in sorted(mapping.items(), key=lambda kv: str(kv[0])):
            family.add_metric([*base.values(), str(key)], float(value))
        out.append(family)

    w = snap.get("worker")
    if w is not None:
        counter("fleet_worker_examples", "Examples trained by this worker.", w["examples"])
        counter("fleet_worker_steps", "Training steps (batches) run by this worker.", w["steps"])
        gauge("fleet_worker_examples_per_second", "Examples trained per second over the last ~10 s.",
              w["examples_per_second"])
        gauge("fleet_worker_steps_per_second", "Steps per second over the last ~10 s.", w["steps_per_second"])
        counter("fleet_worker_pushes", "Gradient pushes sent to servers (push, sync_push, geo_push requests).",
                w["pushes"])
        counter("fleet_worker_pulls", "Parameter pulls from servers (pull_dense, pull_sparse requests).",
                w["pulls"])
        gauge("fleet_worker_pushes_per_second", "Push requests per second over the last ~10 s.",
              w["pushes_per_second"])
        gauge("fleet_worker_pulls_per_second", "Pull requests per second over the last ~10 s.",
              w["pulls_per_second"])
        labelled("counter", "fleet_worker_requests", "Requests sent to servers, by operation.", "op",
                 w["requests"])
        counter("fleet_worker_sent_bytes", "Bytes of requests sent to servers (message frames).", w["sent_bytes"])
        counter("fleet_worker_received_bytes", "Bytes of replies received from servers (message frames).",
                w["received_bytes"])
        labelled("gauge", "fleet_worker_send_queue_depth",
                 "Steps waiting in each async send queue (one queue per gradient).", "queue",
                 w["send_queue_depth"])
        if w["send_queue_depth"]:
            gauge("fleet_worker_send_queue_capacity", "Capacity of each async send queue, in steps.",
                  w["send_queue_capacity"])
        if w["staleness_steps"] is not None:
            gauge("fleet_worker_staleness_steps", "Async: steps handed to the communicator and not sent yet; "
                  "GEO: local steps since the last exchange with the servers.", w["staleness_steps"])
        labelled("gauge", "fleet_worker_heartbeat_age_seconds",
                 "Seconds since each server last answered this worker's heartbeat.", "server",
                 w["heartbeat_age_seconds"])
    s = snap.get("server")
    if s is not None:
        labelled("counter", "fleet_server_requests", "Requests answered, by operation.", "op", s["requests"])
        labelled("gauge", "fleet_server_requests_per_second", "Requests per second over the last ~10 s, by "
                 "operation.", "op", s["requests_per_second"])
        counter("fleet_server_received_bytes", "Bytes of messages received (frames).", s["received_bytes"])
        counter("fleet_server_sent_bytes", "Bytes of replies sent (frames).", s["sent_bytes"])
        tables = s["tables"]
        for metric_name, key, doc in (
                ("fleet_server_table_rows", "rows", "Rows of each parameter this server holds (a distributed "
                                                    "table: rows created so far)."),
                ("fleet_server_table_elements", "elements", "float32 values of each parameter this server holds."),
                ("fleet_server_table_memory_bytes", "bytes", "Memory of each parameter this server holds, with "
                                                             "its optimizer state and index.")):
            family = GaugeMetricFamily(metric_name, doc, labels=names + ["table", "kind"])
            for table, entry in sorted(tables.items()):
                family.add_metric([*base.values(), table, entry["kind"]], float(entry[key]))
            out.append(family)
        labelled("gauge", "fleet_server_parked_requests", "Requests parked until every worker arrives, by wait.",
                 "wait", s["parked"])
        gauge("fleet_server_workers", "Workers of the job.", s["workers"])
        gauge("fleet_server_workers_lost", "Workers lost (heartbeats stopped, or reported a failure).",
              s["workers_lost"])
        gauge("fleet_server_workers_stopped", "Workers that called fleet.stop_worker().", s["workers_stopped"])
        labelled("gauge", "fleet_server_worker_heartbeat_age_seconds",
                 "Seconds since each worker was last heard (any message, heartbeats included).", "worker",
                 s["heartbeat_age_seconds"])
    return out


def _one(cls, name, doc, names, base, value):
    family = cls(name, doc, labels=names)
    family.add_metric(list(base.values()), float(value))
    return family


class _Collector:
    """A prometheus_client collector that reads ``snapshot()`` at each scrape."""

    def __init__(self, telemetry):
        self.telemetry = telemetry

    def collect(self):
        return _families(self.telemetry.snapshot())


def exposition(telemetry=None):
    """The Prometheus text exposition of ``telemetry`` (default: this process's), as str."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(telemetry or TELEMETRY))
    return generate_latest(registry).decode()


class MetricsServer:
    """This process's metrics over HTTP (``/metrics``, any path) in a daemon thread.

    Args:
        port: the TCP port; host: the address to bind.
        telemetry: the ProcessTelemetry to serve (default: this process's).

    Raises:
        TransportError: the port is taken or the address cannot be bound (names host:port
            and FLEET_METRICS_PORT, and the fix).
    """

    def __init__(self, port, host="0.0.0.0", telemetry=None):
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

        self.host, self.port = host, int(port)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(telemetry or TELEMETRY))
        ProcessCollector(registry=registry)
        try:
            self._server, self._thread = start_http_server(self.port, addr=host, registry=registry)
        except OSError as e:
            where = join_endpoint(host, self.port)
            if e.errno == errno.EADDRINUSE:
                raise TransportError(
                    f"cannot serve metrics on {where} ({METRICS_PORT_ENV}={self.port}): port {self.port} is "
                    f"already in use. Give every process of this host its own port (fleetrun --metrics_port "
                    f"BASE gives server i BASE+i and worker j BASE+servers+j), or stop the program holding it "
                    f"(`ss -ltnp | grep :{self.port}`)") from e
            raise TransportError(f"cannot serve metrics on {where} ({METRICS_PORT_ENV}={self.port}): "
                                 f"{e.strerror or e}; set FLEET_BIND_HOST or give another port") from e
        self.url = f"http://{join_endpoint(_reachable(host), self.port)}/metrics"

    def close(self):
        """Stops serving and frees the port. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(5.0)


def _reachable(host):
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


_served = {}  # "server": the MetricsServer of this process, once one runs


def metrics_port_from_env(environ=None):
    """FLEET_METRICS_PORT as an int, or None when unset or empty.

    Raises:
        ConfigError: not an integer in 1..65535 (names the variable and the value).
    """
    import os

    text = (os.environ if environ is None else environ).get(METRICS_PORT_ENV, "").strip()
    if not text:
        return None
    return parse_int(METRICS_PORT_ENV, text, 1, 65536, "a free TCP port for this process's metrics "
                     "(or unset it to serve none)", ConfigError)


def start(fleet):
    """Describes this process from ``fleet``'s role (called by ``fleet.init``) and, when
    FLEET_METRICS_PORT is set, serves its metrics on that port: on FLEET_BIND_HOST if
    set, else on the host of the process's own endpoint, else (no endpoint known, e.g.
    local training) on every interface.

    Returns:
        The MetricsServer, or None when FLEET_METRICS_PORT is unset.

    Raises:
        ConfigError: a malformed FLEET_METRICS_PORT. TransportError: the port is taken.
    """
    if fleet.is_server():
        role, index = "server", fleet.server_index()
        endpoints = fleet.server_endpoints()
    else:
        role, index = "worker", 0 if fleet.is_local() else fleet.worker_index()
        endpoints = [] if fleet.is_local() else fleet.worker_endpoints()
    endpoint = endpoints[index] if index < len(endpoints) else ""
    TELEMETRY.describe(role, index, endpoint)
    port = metrics_port_from_env()
    current = _served.get("server")
    if port is None:
        return None
    host = bind_host() or (split_endpoint(endpoint)[0] if endpoint else "0.0.0.0")
    if current is not None and (current.port, current.host) == (port, host):
        return current
    if current is not None:
        current.close()
        _served.pop("server", None)
    _served["server"] = MetricsServer(port, host)
    return _served["server"]


def stop():
    """Stops this process's metrics server, if one runs (tests; it is a daemon thread)."""
    server = _served.pop("server", None)
    if server is not None:
        server.close()


# ---------------------------------------------------------------------- reading endpoints

def scrape(url, timeout_s):
    """Fetches a metrics endpoint. Blocks at most about ``timeout_s``.

    Returns:
        The exposition text.

    Raises:
        TransportError: no answer in time, refused, or not HTTP 200 (the message says which).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        raise TransportError(f"{url} answered HTTP {e.code}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise TransportError(f"{url} did not answer within {timeout_s:g} s") from e
        text = getattr(reason, "strerror", None) or str(reason)
        raise TransportError(f"{url}: {text}") from e


def parse_metrics(text):
    """{sample name: [(labels dict, value)]} of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out
