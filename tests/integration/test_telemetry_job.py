"""A real fleetrun job watched through its metrics: fleetrun --metrics_port BASE gives
server 0 BASE and worker j BASE+1+j, their counters grow while the job trains (scraped over
HTTP and parsed with prometheus_client's parser), and --live_summary 1 prints its line."""
import os
import random
import re
import time
import socket

import pytest

from fleet.telemetry import parse_metrics, scrape

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "live_model.py")
SUMMARY = re.compile(r"^fleetrun: workers 2: [\d,]+ ex/s, [\d,]+ push/s, [\d,]+ pull/s, lag \d+\.\d steps; "
                     r"servers 1: [\d,]+ req/s, 1\.0K rows, [\d.,]+ [KMG]?B$", re.M)


def _free_run(count):
    """A port p such that p .. p+count-1 are free on 127.0.0.1 now."""
    for _ in range(50):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports found")


def _one(metrics, name, **labels):
    values = [v for found, v in metrics.get(name, ()) if all(found.get(k) == x for k, x in labels.items())]
    assert len(values) == 1, (name, labels, metrics.get(name))
    return values[0]


@pytest.mark.slow
def test_a_job_serves_growing_counters_and_fleetrun_prints_a_live_summary(tmp_path, start_fleetrun, procs,
                                                                           clean_env, wait_for):
    base = _free_run(3)
    out = tmp_path / "out"
    out.mkdir()
    launcher = start_fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", tmp_path / "log",
                              "--metrics_port", base, "--live_summary", 1, SCRIPT, "async", out, 8, 4,
                              "--until-stop", "--step-sleep", 0.02, env=clean_env)
    server_url, worker_url = (f"http://127.0.0.1:{base + i}/metrics" for i in (0, 2))  # server 0, worker 1
    wait_for(lambda: (out / "worker1.training").exists() or launcher.poll() is not None, 90,
             "worker 1 trains a step")
    assert launcher.poll() is None, launcher.communicate()[1]
    worker, server = parse_metrics(scrape(worker_url, 5)), parse_metrics(scrape(server_url, 5))
    me = {"role": "worker", "index": "1"}
    examples = _one(worker, "fleet_worker_examples_total", **me)
    pushes = _one(server, "fleet_server_requests_total", role="server", index="0", op="push")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", worker["fleet_worker_examples_total"][0][0]["endpoint"])

    def grown():
        nonlocal worker, server
        worker, server = parse_metrics(scrape(worker_url, 5)), parse_metrics(scrape(server_url, 5))
        return (_one(worker, "fleet_worker_examples_total", **me) > examples
                and _one(server, "fleet_server_requests_total", op="push") > pushes)

    wait_for(grown, 30, "the worker's examples and the server's pushes grow")
    assert _one(worker, "fleet_worker_examples_total") % 4 == 0  # batches of 4 examples
    assert _one(worker, "fleet_worker_pushes_total") > 0 and _one(worker, "fleet_worker_sent_bytes_total") > 0
    assert _one(worker, "fleet_worker_staleness_steps") >= 0
    server_endpoint = server["fleet_server_workers"][0][0]["endpoint"]
    assert _one(worker, "fleet_worker_heartbeat_age_seconds", server=server_endpoint) < 15
    assert _one(server, "fleet_server_table_rows", table="emb", kind="sparse") == 1000
    assert _one(server, "fleet_server_workers") == 2 and _one(server, "fleet_server_workers_lost") == 0
    assert set(_one(server, "fleet_server_worker_heartbeat_age_seconds", worker=w) < 15 for w in "01") == {True}
    # Let --live_summary 1 make at least two rounds while every process still trains (on a
    # busy machine the steps above can all fit in its first second, and its rounds after the
    # stop only see the server).
    time.sleep(2.5)
    (out / "stop").write_text("")
    stdout, stderr = procs.communicate(launcher, 60)
    assert launcher.returncode == 0, stderr
    assert SUMMARY.search(stderr), stderr
