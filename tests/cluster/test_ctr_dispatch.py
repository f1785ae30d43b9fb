"""CTR-DNN across three hosts dispatched over ssh from a fourth (fleetrun --hosts with a
hostfile: servers on h1 and h2, workers on h1, h2 and h3), compared with the same job on
one host: sync to float tolerance, async within 0.01 test AUC."""
import os
import shutil
import sys

import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_ctr_dnn_dispatched_over_ssh_matches_the_same_job_on_one_host(
        cluster_factory, tmp_path, ctr_data, strategy):
    cluster = cluster_factory(4, sshd=True)
    h1, h2, h3, dispatcher = cluster.hosts
    job = tmp_path / "job"
    job.mkdir()
    for name in os.listdir(ctr.EXAMPLE):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ctr.EXAMPLE, name), job / name)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# servers on the first two hosts\n{h1.addr} servers=1\n"
                        f"{h2.addr} servers=1\n{h3.addr}\n")
    model = tmp_path / "model"
    args = ctr.train_args(ctr_data, model, strategy)[1:]  # the script is job/train.py
    argv = [sys.executable, "-m", "fleet.launch", "--hosts", hostfile, "--server_num_per_host", 0,
            "--worker_num_per_host", 1, "--ssh_config", cluster.ssh_config,
            "--dispatch", job, "--remote_dir", os.path.join(cluster.tmpdir, "ws", "{host}"),
            "--start_port", ctr.PORT_SERVER, *ctr.same_blas_kernels(), "train.py", *args]
    here = tmp_path / "here"
    here.mkdir()
    r = dispatcher.run(argv, 240, cwd=here, env=ctr.clean_env(PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"    {h1.addr}: servers 0 ({h1.addr}:6170), workers 0" in r.stderr
    assert f"    {h3.addr}: servers none, workers 2" in r.stderr
    assert "epoch 0: 20000 examples" in r.stdout  # worker 0's output, from h1
    for i, h in enumerate((h1, h2, h3)):
        assert f"workerlog.{i}" in os.listdir(here / "log" / h.addr)
    assert sorted(os.listdir(here / "log" / h3.addr)) == ["fleetrun-result.json", "fleetrun.log",
                                                         "workerlog.2"]
    assert cluster.leftovers() == {}
    one = ctr.one_host(tmp_path, ctr_data, strategy)
    ctr.assert_matches_one_host(model, one, ctr_data, strategy, "3 hosts over ssh")
