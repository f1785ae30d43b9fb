"""CTR-DNN (examples/ctr_dnn) started by mpirun with MPISymetricRoleMaker, on one host and
across two, against the same job started by fleetrun.

- One host: ``mpirun -np 4`` (ranks 0, 2 servers; 1, 3 workers) in sync mode saves the
  same parameters as fleetrun with 2 servers and 2 workers (to 1e-5), and async reaches
  fleetrun's test AUC within 0.01.
- Two hosts: two network namespaces with their own hostnames, joined by a bridge in a
  third namespace where mpirun runs; mpirun starts its daemons in them through a
  ``plm_rsh_agent`` script (``ip netns exec``) and keeps its own traffic on their subnet.
  The servers advertise the namespaces' addresses, the parameters cross the veth links,
  and the results are those of the one-host job.

Every job runs with one BLAS thread per process, as fleetrun gives two workers on two
cores: with the same thread counts the sync jobs are bit-identical.

Needs Debian's openmpi-bin (``.ci/run`` installs it), mpi4py (``pip install -e .[mpi]``)
and, for two hosts, root, iproute2 and util-linux's unshare.
"""
import atexit
import json
import os
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from fleet.framework.io import VarsReader

pytestmark = pytest.mark.slow

EXAMPLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn"))
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EPOCHS = 2
TRAIN_ARGS = ["--threads", "1", "--print_period", "0", "--epochs", str(EPOCHS), "--batch_size", "250"]
BLAS_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
JOB_TIMEOUT = 180


def _require_mpi():
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is not installed: apt-get install openmpi-bin libopenmpi-dev (CI's .ci/run installs "
                    "them)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.fail("mpi4py is not installed: pip install -e .[mpi]")


def _environment():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    env.pop("FLEET_MPI_BASE_PORT", None)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(BLAS_ONE_THREAD)
    return env


def _run(args, timeout=JOB_TIMEOUT):
    proc = subprocess.run([sys.executable, *args], cwd=EXAMPLE, env=_environment(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return proc.stdout


def _test_auc(model_dir, data):
    out = _run(["infer.py", "--model_dir", os.path.join(model_dir, f"epoch_{EPOCHS - 1}"), "--data_dir", str(data)])
    return json.loads(out.strip().splitlines()[-1])["auc"]


def _max_difference(dir_a, dir_b):
    """{variable: largest absolute difference} between two saves, after checking they hold
    the same variables with the same shapes."""
    a, b = VarsReader(dir_a), VarsReader(dir_b)
    assert sorted(a.names()) == sorted(b.names())
    out = {}
    for name in a.names():
        x, y = a.get(name), b.get(name)
        assert x.shape == y.shape, name
        out[name] = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    _require_mpi()
    path = tmp_path_factory.mktemp("mpi") / "data"
    _run(["generate_data.py", "--out_dir", str(path), "--train_lines", "60000", "--test_lines", "10000"])
    return path


@pytest.fixture(scope="module")
def fleetrun_job(data, tmp_path_factory):
    """strategy -> model dir of the job started by fleetrun (2 servers, 2 workers), run
    once per module on first use."""
    done = {}

    def job(strategy):
        if strategy not in done:
            model = tmp_path_factory.mktemp(f"fleetrun_{strategy}")
            _run(["-m", "fleet.launch", "--server_num", "2", "--worker_num", "2", "--log_dir", str(model / "log"),
                  "train.py", "--data_dir", str(data), "--model_dir", str(model), "--strategy", strategy,
                  *TRAIN_ARGS])
            done[strategy] = str(model)
        return done[strategy]

    return job


def _mpirun_args(extra):
    args = ["mpirun"]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    args += ["--oversubscribe", "--bind-to", "none", "--tag-output", "-np", "4", *extra]
    for name in ("PYTHONPATH", "NUMBA_CACHE_DIR", *BLAS_ONE_THREAD):
        if name in _environment():
            args += ["-x", name]
    return args


def _run_mpirun(procs, command, model, data, strategy):
    train = [sys.executable, "train.py", "--role_maker", "mpi", "--data_dir", str(data), "--model_dir", str(model),
             "--strategy", strategy, *TRAIN_ARGS]
    proc = procs.start([*command, *train], cwd=EXAMPLE, env=_environment(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    out, _ = procs.communicate(proc, JOB_TIMEOUT)
    assert proc.returncode == 0, f"mpirun exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _check_job_ended_cleanly(out):
    """Both servers saw every worker stop and both workers trained every epoch: mpirun's
    exit code 0 then says every rank exited 0."""
    for rank in (0, 2):
        assert re.search(rf"^\[1,{rank}\]<stderr>:.*fleet: server \S+ done: every worker stopped$", out, re.M), out
    for rank in (1, 3):
        # no ^: mpirun may append a rank's line to another's that lacked its newline yet
        assert re.search(rf"\[1,{rank}\]<stdout>:epoch {EPOCHS - 1}: 30000 examples", out), out


def _advertised(out):
    """{rank: (role, index, endpoint)} from each rank's log line."""
    found = {}
    for rank, role, index, endpoint in re.findall(
            r"^\[1,(\d)\]<stderr>:.*MPISymetricRoleMaker: rank \d of 4 is (server|worker) (\d) at (\S+) \(", out, re.M):
        found[int(rank)] = (role, int(index), endpoint)
    return found


def _check_sync_equals(reference, model):
    differences = _max_difference(os.path.join(reference, f"epoch_{EPOCHS - 1}"),
                                  os.path.join(model, f"epoch_{EPOCHS - 1}"))
    assert "fc_0.w_0" in differences and "SparseFeatFactors" in differences
    worst = {k: v for k, v in differences.items() if v > 1e-5}
    assert not worst, worst


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_mpirun_on_one_host_matches_fleetrun(procs, data, fleetrun_job, tmp_path, strategy):
    out = _run_mpirun(procs, _mpirun_args([]), tmp_path / "model", data, strategy)
    _check_job_ended_cleanly(out)
    advertised = _advertised(out)
    assert {r: a[:2] for r, a in advertised.items()} == {0: ("server", 0), 1: ("worker", 0), 2: ("server", 1),
                                                         3: ("worker", 1)}
    assert all(a[2].startswith("127.0.0.1:") for a in advertised.values())  # every rank on this host
    reference = fleetrun_job(strategy)
    if strategy == "sync":
        _check_sync_equals(reference, str(tmp_path / "model"))
    else:
        mpi_auc, fleetrun_auc = _test_auc(str(tmp_path / "model"), data), _test_auc(reference, data)
        assert mpi_auc > 0.8 and abs(mpi_auc - fleetrun_auc) < 0.01, (mpi_auc, fleetrun_auc)


# ---------------------------------------------------------------- two hosts in namespaces
def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


class TwoHosts:
    """Namespaces ``<prefix>a`` and ``<prefix>b`` (the hosts, eth0 at 10.X.Y.1 and .2) and
    ``<prefix>h`` (mpirun's, 10.X.Y.3 on the bridge joining the hosts' veth links)."""

    def __init__(self, tmp_path):
        self.prefix = f"fm{random.randrange(16 ** 6):06x}"
        x, y = random.randrange(16, 250), random.randrange(1, 255)
        self.subnet = f"10.{x}.{y}.0/24"
        self.hosts = {f"10.{x}.{y}.1": self.prefix + "a", f"10.{x}.{y}.2": self.prefix + "b"}
        self.head, self.head_address = self.prefix + "h", f"10.{x}.{y}.3"
        self.agent = tmp_path / "netns_agent.sh"
        self.created = []

    def setup(self):
        for ns in (self.head, *self.hosts.values()):
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        bridge = self.prefix + "br"
        _ip("-n", self.head, "link", "add", bridge, "type", "bridge")
        _ip("-n", self.head, "addr", "add", self.head_address + "/24", "dev", bridge)
        _ip("-n", self.head, "link", "set", bridge, "up")
        for address, ns in self.hosts.items():
            veth = self.prefix + ns[-1]  # the head's end; the host's end is eth0 in its namespace
            _ip("-n", self.head, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.head, "link", "set", veth, "master", bridge)
            _ip("-n", self.head, "link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", address + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        cases = "".join(f"  {address}) ns={ns};;\n" for address, ns in self.hosts.items())
        # mpirun runs "AGENT HOST COMMAND..." to start its daemon on HOST: run COMMAND in
        # HOST's namespace, with the namespace's name as hostname (own UTS namespace) so
        # that Open MPI does not take the two hosts for one and share memory between them.
        self.agent.write_text(
            "#!/bin/sh\n"
            "host=$1; shift\n"
            f'case "$host" in\n{cases}'
            '  *) echo "netns_agent: no namespace for host $host" >&2; exit 1;;\n'
            "esac\n"
            'exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"\n')
        self.agent.chmod(0o755)

    def rx_bytes(self, ns):
        out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/statistics/rx_bytes"],
                             capture_output=True, text=True, timeout=30, check=True)
        return int(out.stdout)

    def teardown(self):
        """Kills what still runs in the namespaces (by pid) and deletes them; idempotent."""
        for ns in reversed(self.created):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns, check=False)
        self.created = []


@pytest.fixture
def two_hosts(tmp_path):
    _require_mpi()
    if os.geteuid() != 0:
        pytest.fail("the two-host test makes network namespaces: run it as root (CI does)")
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: apt-get install {package}")
    hosts = TwoHosts(tmp_path)
    atexit.register(hosts.teardown)  # also after Ctrl-C ends the session
    try:
        hosts.setup()
        yield hosts
    finally:
        hosts.teardown()
        atexit.unregister(hosts.teardown)
        left = _ip("netns", "list")
        assert hosts.prefix not in left, f"namespaces left behind: {left}"


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_mpirun_across_two_hosts_matches_the_one_host_job(procs, data, fleetrun_job, two_hosts, tmp_path, strategy):
    (address_a, ns_a), (address_b, ns_b) = two_hosts.hosts.items()
    command = ["ip", "netns", "exec", two_hosts.head, *_mpirun_args([
        "--host", f"{address_a}:2,{address_b}:2", "--mca", "plm_rsh_agent", str(two_hosts.agent),
        "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "btl_tcp_if_include", two_hosts.subnet,
        "--mca", "oob_tcp_if_include", two_hosts.subnet])]
    received_before = two_hosts.rx_bytes(ns_b)
    out = _run_mpirun(procs, command, tmp_path / "model", data, strategy)
    _check_job_ended_cleanly(out)
    advertised = _advertised(out)
    # ranks 0, 1 on host a and 2, 3 on host b: each host has a server and a worker
    assert {r: a[:2] for r, a in advertised.items()} == {0: ("server", 0), 1: ("worker", 0), 2: ("server", 1),
                                                         3: ("worker", 1)}
    for rank, host in ((0, address_a), (1, address_a), (2, address_b), (3, address_b)):
        assert advertised[rank][2].startswith(host + ":"), (rank, advertised[rank])
        assert re.search(rf"^\[1,{rank}\]<stderr>:.*\(address: interface eth0 \({re.escape(two_hosts.subnet)}\) "
                         r"reaches 1 of the 1 other hosts directly\)$", out, re.M), out
    assert re.search(rf"fleet: server 0 listening on {re.escape(address_a)}:\d+;", out)
    assert re.search(rf"fleet: server 1 listening on {re.escape(address_b)}:\d+;", out)
    assert "127.0.0.1" not in out
    # worker 1 on host b pulls server 0's dense parameters (about 1.4 MB a pull) over the veth link
    assert two_hosts.rx_bytes(ns_b) - received_before > 50_000_000
    reference = fleetrun_job(strategy)
    if strategy == "sync":
        _check_sync_equals(reference, str(tmp_path / "model"))
    else:
        mpi_auc, fleetrun_auc = _test_auc(str(tmp_path / "model"), data), _test_auc(reference, data)
        assert mpi_auc > 0.8 and abs(mpi_auc - fleetrun_auc) < 0.01, (mpi_auc, fleetrun_auc)
