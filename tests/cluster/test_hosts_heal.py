"""fleetrun --hosts --max_restarts across hosts (network namespaces with sshd): a host lost
mid-training leaves the job, and its server and worker move to the hosts that remain.

Three hosts run one server and one worker each (sync CTR-DNN, checkpoints every 20 steps
in a directory every namespace sees). After a checkpoint, h2's link goes down (its sshd is
unreachable) and every process of the job there is killed. The dispatcher's restart
preflight finds h2 unreachable, drops it, moves server 1 and worker 1 to h1 (the first of
the hosts with the fewest servers / workers) at h1's next ports, and restarts h1 and h3
with the rebuilt endpoint lists; the servers load the checkpoint's shards unchanged, every
worker resumes its own place. The job ends by itself at the test AUC of the same job
undisturbed on one host, within 0.005. A second run stops h2's sshd instead (ssh refused,
the link up). The time from the loss to training again is measured and printed, not
asserted.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--sparse_feature_dim", 100001]
AUC_BOUND = 0.005
FAST_LIVENESS = dict(FLEET_HEARTBEAT_MS="500", FLEET_HEARTBEAT_TIMEOUT_MS="3000")


def _evaluate(model, data):
    out = ctr.python("infer.py", "--model_dir", ctr.last_epoch(model), "--data_dir", data, *SMALL)
    return float(re.search(r'"auc": ([0-9.]+)', out).group(1))


@pytest.fixture(scope="module")
def reference_auc(tmp_path_factory, ctr_data):
    """The test AUC of the same job undisturbed on one host (3 servers, 3 workers)."""
    tmp_path = tmp_path_factory.mktemp("undisturbed")
    model = tmp_path / "one"
    ctr.python("-m", "fleet.launch", "--server_num", 3, "--worker_num", 3, "--log_dir", model / "log",
               *ctr.train_args(ctr_data, model, "sync"), *SMALL, cwd=tmp_path, timeout=180)
    return _evaluate(model, ctr_data)


def _lose(host, how):
    """Make host lost: "link" takes its link down (its sshd unreachable), "sshd" stops its
    sshd (ssh refused, the link up); then every other process there is killed."""
    if how == "link":
        host.link_down()
    else:
        host.stop_sshd()
    daemon = host.sshd.pid if host.sshd is not None else None
    for pid in host.pids():
        if pid != daemon:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _stamped_lines(stream, into):
    """Collect (time.monotonic(), line) of a text stream until it ends."""
    for line in iter(stream.readline, ""):
        into.append((time.monotonic(), line))


def _checkpoints(ckpt):
    return {p.name for p in ckpt.glob("ckpt-*")} if ckpt.is_dir() else set()


@pytest.mark.parametrize("how, problem", [("link", "unreachable"), ("sshd", "connection refused")])
def test_a_lost_host_leaves_and_its_server_and_worker_move_to_the_remaining_hosts(
        cluster_factory, tmp_path, ctr_data, reference_auc, how, problem):
    cluster = cluster_factory(4, sshd=True)
    h1, h2, h3, dispatcher = cluster.hosts
    job = tmp_path / "job"
    job.mkdir()
    for name in os.listdir(ctr.EXAMPLE):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ctr.EXAMPLE, name), job / name)
    model, ckpt = tmp_path / "model", tmp_path / "ckpt"
    args = ctr.train_args(ctr_data, model, "sync")[1:] + SMALL + ["--checkpoint_dir", ckpt, "--checkpoint_steps", 20]
    argv = [sys.executable, "-m", "fleet.launch", "--hosts", f"{h1.addr},{h2.addr},{h3.addr}",
            "--server_num_per_host", 1, "--worker_num_per_host", 1, "--ssh_config", cluster.ssh_config,
            "--max_restarts", 2, "--dispatch", job, "--remote_dir", os.path.join(cluster.tmpdir, "ws", "{host}"),
            "--start_port", ctr.PORT_SERVER, *ctr.same_blas_kernels(), "train.py", *args]
    here = tmp_path / "here"
    here.mkdir()
    proc = dispatcher.popen(argv, cwd=here, env=ctr.clean_env(PYTHONPATH=REPO, **FAST_LIVENESS),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    readers = [threading.Thread(target=_stamped_lines, args=(s, into), daemon=True)
               for s, into in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 120
    while "ckpt-40" not in _checkpoints(ckpt):
        assert proc.poll() is None and time.monotonic() < deadline, "the job wrote no checkpoint ckpt-40"
        time.sleep(0.1)
    # h2 is lost: its link goes down or its sshd stops, every process of the job there dies
    lost_at = time.monotonic()
    _lose(h2, how)
    while proc.poll() is None and time.monotonic() < deadline + 300:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for t in readers:
        t.join(10)
    out_text, err_text = "".join(l for _, l in out), "".join(l for _, l in err)
    (tmp_path / "dispatcher.err").write_text("".join(f"{t - lost_at:+8.2f} {line}" for t, line in err))
    assert proc.returncode == 0, err_text[-5000:]
    lost = re.escape(f"host 1 on host {h2.addr} was lost (failed the preflight before the restart: host {h2.addr}: "
                     f"{problem} (ssh: connect to host {h2.addr} port 22: ")
    assert re.search(rf"fleetrun: restart 1 of 2 \(--max_restarts 2\): {lost}", err_text), err_text[-5000:]
    moves = (f"server 1 moves from {h2.addr} to {h1.addr} ({h1.addr}:6172)",
             f"worker 1 moves from {h2.addr} to {h1.addr} ({h1.addr}:6173)")
    for move in moves:
        assert f"fleetrun: {move}\n" in err_text
    assert f"    {h1.addr}: servers 0-1 ({h1.addr}:6170,{h1.addr}:6172), workers 0-1\n" in err_text
    assert f"    {h3.addr}: servers 2 ({h3.addr}:6170), workers 2\n" in err_text
    assert re.search(rf"fleetrun: done after 1 restart; 1 failure, in order:\n    1\. attempt 0: {lost}", err_text)
    log = (here / "log" / "restarts.log").read_text()
    assert f"1 host left the job ({h2.addr}): {moves[0]}; {moves[1]}\n" in log
    # the moved server and worker ran on h1 in the second attempt; h2's first attempt is kept
    assert {"serverlog.0", "serverlog.1", "workerlog.0", "workerlog.1"} <= set(os.listdir(here / "log" / h1.addr))
    assert re.search(r"^worker 1 of 3: resuming the epoch after the [1-9][0-9]* batches trained before the "
                     "checkpoint", (here / "log" / h1.addr / "workerlog.1").read_text(), re.M)
    assert (here / "log" / "attempt-0" / h2.addr).is_dir() and not (here / "log" / h2.addr).exists()
    first = next(i for i, (_, line) in enumerate(err) if "fleetrun: restart 1 of 2" in line)
    print("".join(line for _, line in err[first:first + 8]), end="")
    resumed_at = next(t for t, line in out if "resumed from" in line)
    stopped_at = next(t for t, line in err if "preflight of the 3 hosts of the job before restart 1" in line)
    restart_at = next(t for t, line in err if "fleetrun: restart 1 of 2" in line)
    print(f"--hosts, h2 lost ({how}): training again {resumed_at - lost_at:.1f} s after h2 was lost (worker 0 "
          f"printed that it resumed from the checkpoint); every host stopped and its logs fetched after "
          f"{stopped_at - lost_at:.1f} s, the restart preflight took {restart_at - stopped_at:.1f} s")
    if how == "link":
        h2.link_up()
    assert cluster.leftovers() == {}
    auc = _evaluate(model, ctr_data)
    print(f"--hosts, h2 lost ({how}): test AUC {auc:.4f} after the move, undisturbed {reference_auc:.4f}")
    assert abs(auc - reference_auc) < AUC_BOUND
