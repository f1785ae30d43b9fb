"""A worker of a sync job that gets no data, or whose script fails or ends without
stop_worker(): it tells the servers, so the job stops at once naming it and why (not after
the heartbeat timeout), and no model is saved. fleetrun jobs of 1 server and 2 workers
(about 2 s each) with a heartbeat timeout longer than the test may take."""
import os
import re

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "data_model.py")


@pytest.mark.slow
def test_a_sync_worker_split_no_files_fails_naming_itself_and_the_job_stops_without_a_model(
        tmp_path, fleetrun, clean_env):
    data = tmp_path / "part-0"
    data.write_text("".join(f"2 0.5 {i % 3 * 0.1} 1 {i} 1 {i % 2}\n" for i in range(40)))
    out = tmp_path / "out"
    out.mkdir()
    # A heartbeat timeout far beyond the test's limit: the job can only end in time if the
    # failing worker tells the servers itself.
    env = dict(clean_env, FLEET_HEARTBEAT_TIMEOUT_MS="120000", FLEET_WAIT_LOG_MS="500")
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 60, SCRIPT, "sync", out, str(data),
                 env=env, timeout=60)
    assert r.returncode == 1, r.stderr
    worker1 = (tmp_path / "log" / "workerlog.1").read_text()
    message = ("fleet.errors.DataError: worker 1 of 2: train_from_dataset ran a pass over 0 examples: the "
               "dataset's file list is empty (set_filelist([])); give every worker at least one file "
               "(fleet.split_files(files) gives a worker none when there are fewer files than workers). Nothing "
               "was trained, so the pass is an error rather than a model that looks trained")
    assert message in worker1, worker1[-3000:]
    worker0 = (tmp_path / "log" / "workerlog.0").read_text()
    assert re.search(r"fleet.errors.ServerError: server 127\.0\.0\.1:\d+ failed: worker 1 was lost: it failed: "
                     r"DataError: worker 1 of 2: train_from_dataset ran a pass over 0 examples", worker0), worker0[-3000:]
    server = (tmp_path / "log" / "serverlog.0").read_text()
    assert re.search(r"server 0 listening on 127\.0\.0\.1:\d+; expecting 2 workers \(sync\)", server), server
    assert "worker 1 was lost: it failed: DataError: worker 1 of 2:" in server
    assert "worker 0 was lost" not in server  # worker 0 was told of the failure; it does not report one
    assert not (out / "model").exists()
    pid = int((out / "worker1.pid").read_text())
    assert f"the root cause: worker 1 (pid {pid}) exited with code 1, the first process to fail" in r.stderr
    report = r.stderr.split("fleetrun: how each process ended:\n")[1]
    assert f"    worker 1 (pid {pid}): exited with code 1 (the root cause)\n" in report
    assert re.search(r"    worker 0 \(pid \d+\): exited with code 1 \d+\.\d s after worker 1: "
                     r"fleet.errors.ServerError: server 127\.0\.0\.1:\d+ failed: worker 1 was lost: it failed: "
                     r"DataError", report), report
    assert re.search(r"    server 0 \(pid \d+, 127\.0\.0\.1:\d+\): exited with code 1 \d+\.\d s after worker 1: "
                     r"fleet.errors.FleetTimeoutError: server 127\.0\.0\.1:\d+ stopped: worker 1 was lost: it failed: "
                     r"DataError", report), report


@pytest.mark.slow
@pytest.mark.parametrize("how, reason", [
    ("raise", "RuntimeError: worker 1 broke outside train_from_dataset"),
    ("exit", "its script ended without calling fleet.stop_worker()")])
def test_a_worker_whose_script_fails_or_ends_without_stop_worker_fails_the_job_at_once(
        tmp_path, fleetrun, clean_env, how, reason):
    data = tmp_path / "part-0"
    data.write_text("".join(f"2 0.5 {i % 3 * 0.1} 1 {i} 1 {i % 2}\n" for i in range(40)))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(clean_env, FLEET_HEARTBEAT_TIMEOUT_MS="120000")
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 60, SCRIPT, "sync", out,
                 f"{data},{data}", f"--worker1-{how}", env=env, timeout=60)
    assert r.returncode == 1, r.stderr
    worker0 = (tmp_path / "log" / "workerlog.0").read_text()
    assert re.search(rf"fleet.errors.ServerError: server 127\.0\.0\.1:\d+ failed: worker 1 was lost: it failed: "
                     rf"{re.escape(reason)}. The job cannot go on", worker0), worker0[-3000:]
    assert not (out / "model").exists()
