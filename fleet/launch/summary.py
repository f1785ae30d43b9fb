"""fleetrun --live_summary: one line every few seconds about the job's processes on this
host, read from their metrics endpoints (fleetrun --metrics_port; ``fleet.telemetry``).

Every SECONDS the processes still running are scraped at once over HTTP (each with a
bounded timeout) and one line goes to fleetrun's stderr, e.g.

    fleetrun: workers 2: 41,200 ex/s, 38 push/s, 40 pull/s, lag 1.2 steps; servers 1: 80 req/s, 1.2M rows, 180 MB

Rates are the processes' own (over their last ~10 s); "lag" is the mean staleness of the
workers that have one (async: steps not yet sent; GEO: steps since the last exchange);
"rows" counts the embedding rows (is_sparse and distributed tables) the servers hold and
the memory of every table with its optimizer state (KB, MB, GB: powers of 1000). Processes that did not answer are
named with the reason ("no answer from worker 1 (...: Connection refused)"), so a process
that has not reached ``fleet.init`` yet, or hangs, shows.
"""
from __future__ import annotations

import concurrent.futures
import threading

from fleet.errors import TransportError
from fleet.launch.report import say
from fleet.telemetry import parse_metrics, scrape

MAX_SCRAPE_SECONDS = 2.0


def _sum(metrics, name, keep=lambda labels: True):
    return sum(value for labels, value in metrics.get(name, ()) if keep(labels))


def _si(value):
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def _bytes(value):
    for limit, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if value >= limit:
            return f"{value / limit:,.0f} {unit}" if value >= 10 * limit else f"{value / limit:.1f} {unit}"
    return f"{value:.0f} B"


def summary_line(results):
    """The summary of one round of scrapes.

    Args:
        results: [(name, role, metrics or error text)], metrics as ``parse_metrics`` gives.

    Returns:
        The line (without "fleetrun: ").
    """
    parts = []
    for role in ("worker", "server"):
        mine = [r for r in results if r[1] == role]
        if not mine:
            continue
        ok = [m for _, _, m in mine if not isinstance(m, str)]
        count = f"{len(ok)}" if len(ok) == len(mine) else f"{len(ok)} of {len(mine)}"
        if role == "worker":
            text = f"workers {count}"
            if ok:
                ex = sum(_sum(m, "fleet_worker_examples_per_second") for m in ok)
                push = sum(_sum(m, "fleet_worker_pushes_per_second") for m in ok)
                pull = sum(_sum(m, "fleet_worker_pulls_per_second") for m in ok)
                text += f": {ex:,.0f} ex/s, {push:,.0f} push/s, {pull:,.0f} pull/s"
                lags = [_sum(m, "fleet_worker_staleness_steps") for m in ok if "fleet_worker_staleness_steps" in m]
                if lags:
                    text += f", lag {sum(lags) / len(lags):.1f} steps"
        else:
            text = f"servers {count}"
            if ok:
                req = sum(_sum(m, "fleet_server_requests_per_second",
                               lambda labels: labels.get("op") not in ("heartbeat", "ping")) for m in ok)
                rows = sum(_sum(m, "fleet_server_table_rows",
                                lambda labels: labels.get("kind") in ("sparse", "distributed")) for m in ok)
                memory = sum(_sum(m, "fleet_server_table_memory_bytes") for m in ok)
                text += f": {req:,.0f} req/s, {_si(rows)} rows, {_bytes(memory)}"
        parts.append(text)
    silent = [f"{name} ({m})" for name, _, m in results if isinstance(m, str)]
    if silent:
        parts.append("no answer from " + ", ".join(silent))
    return "; ".join(parts)


class LiveSummary:
    """A daemon thread printing ``summary_line`` every ``interval`` seconds.

    Args:
        targets: callable returning [(name, role, metrics url)] of the processes to read
            now (those still running).
        interval: seconds between lines.
    """

    def __init__(self, targets, interval):
        self.targets = targets
        self.interval = float(interval)
        self.timeout = min(self.interval, MAX_SCRAPE_SECONDS)
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="fleetrun-scrape")
        self._thread = threading.Thread(target=self._run, name="fleetrun-live-summary", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        """Stops printing; waits up to one scrape timeout for the round in progress."""
        self._stop.set()
        self._thread.join(self.timeout + 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def once(self):
        """Scrapes every target (at once, each bounded) and returns the line, or None when
        no process runs."""
        targets = list(self.targets())
        if not targets:
            return None
        futures = [self._pool.submit(_read, url, self.timeout) for _, _, url in targets]
        results = []
        for (name, role, _), future in zip(targets, futures):
            try:
                results.append((name, role, future.result(self.timeout + 1.0)))
            except concurrent.futures.TimeoutError:
                results.append((name, role, f"no answer within {self.timeout:g} s"))
        return summary_line(results)

    def _run(self):
        while not self._stop.wait(self.interval):
            line = self.once()
            if line and not self._stop.is_set():
                say(line)


def _read(url, timeout):
    try:
        return parse_metrics(scrape(url, timeout))
    except TransportError as e:
        return str(e)
    except ValueError as e:  # not the Prometheus text format
        return f"{url} did not answer in the Prometheus text format ({e})"
