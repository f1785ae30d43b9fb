"""Which processes of a job fleetrun starts on this host (fleet.launch.this_host), the
encryption a multi-host job requires, and the environment it gives its processes."""
import os
import stat

import pytest

from fleet.errors import ConfigError
from fleet.launch import LaunchConfig, build_parser, config_from_args, process_environment
from fleet.launch import this_host
from fleet.launch.from_args import make_keys

def _head(placement, n):
    return (placement.servers, placement.workers, placement.whole_job)[:n]


SERVERS = ("10.9.0.1:6170", "10.9.0.2:6170")
WORKERS = ("10.9.0.1:6171", "10.9.0.2:6171", "10.9.0.3:6171")


@pytest.fixture
def host_with(monkeypatch):
    """host_with(addresses, nics=None): this host's interfaces carry these addresses."""
    def make(addresses, nics=None):
        nics = nics or {"eth0": list(addresses)}
        monkeypatch.setattr(this_host, "interface_addresses",
                            lambda nic=None: (set(a for v in nics.values() for a in v) | {"127.0.0.1"})
                            if nic is None else set(nics[nic]))
    return make


def test_each_host_starts_the_processes_its_addresses_name(host_with):
    host_with(["10.9.0.2"])
    placement = this_host.place(SERVERS, WORKERS)
    assert (placement.servers, placement.workers, placement.whole_job) == ((1,), (1,), False)
    assert placement.name == "10.9.0.2" and placement.bind_any == ()
    host_with(["10.9.0.3"])
    assert _head(this_host.place(SERVERS, WORKERS), 3) == ((), (2,), False)


def test_a_job_whose_every_endpoint_is_here_is_a_one_host_job(host_with):
    host_with(["10.9.0.1", "10.9.0.2", "10.9.0.3"])
    assert _head(this_host.place(SERVERS, WORKERS), 3) == ((0, 1), (0, 1, 2), True)
    assert _head(this_host.place(("127.0.0.1:1",), ("127.0.0.1:2", "localhost:3")), 3) == ((0,), (0, 1), True)


def test_a_host_named_by_no_endpoint_says_so(host_with):
    host_with(["10.9.0.7"])
    with pytest.raises(ConfigError) as info:
        this_host.place(SERVERS, WORKERS)
    assert str(info.value) == (
        "this host (addresses 10.9.0.7, 127.0.0.1, from its interfaces) runs none of the job's "
        "processes: the endpoints name 10.9.0.1, 10.9.0.2, 10.9.0.3. Run fleetrun on those hosts, "
        "or give --host ADDR (or --nic NAME) if this host is one of them under another address")


def test_loopback_endpoints_in_a_multi_host_job_are_refused(host_with):
    host_with(["10.9.0.1"])
    with pytest.raises(ConfigError) as info:
        this_host.place(SERVERS, ("127.0.0.1:6171", "10.9.0.3:6171"))
    assert str(info.value).startswith(
        "endpoint 127.0.0.1:6171 is a loopback address, but the job spans several hosts")


def test_nic_restricts_the_addresses_that_count(host_with):
    host_with(None, nics={"eth0": ["10.9.0.1"], "eth1": ["10.9.0.3"]})
    assert _head(this_host.place(SERVERS, WORKERS, nic="eth1"), 2) == ((), (2,))
    assert _head(this_host.place(SERVERS, WORKERS, nic="eth0"), 2) == ((0,), (0,))


def test_an_unknown_nic_lists_the_interfaces_there_are(monkeypatch):
    with pytest.raises(ConfigError) as info:
        this_host.interface_addresses("nosuch9")
    message = str(info.value)
    assert message.startswith("--nic 'nosuch9' is not an interface of this host; interfaces here: ")
    assert "lo: 127.0.0.1" in message and message.endswith(
        "Give the interface of the cluster network (PADDLE_NIC sets the default)")


def test_host_override_binds_the_wildcard_for_an_address_not_on_an_interface(host_with):
    host_with(["192.168.5.5"])
    placement = this_host.place(SERVERS, WORKERS, host="10.9.0.1")
    assert _head(placement, 3) == ((0,), (0,), False)
    assert placement.bind_any == (0,) and placement.how == "from --host"


def _args(*argv):
    return build_parser().parse_args([*map(str, argv), "train.py"])


def test_a_multi_host_job_needs_keys_or_insecure(host_with, monkeypatch, tmp_path):
    host_with(["10.9.0.2"])
    for name in ("FLEET_CURVE_KEYS_DIR", "FLEET_CURVE_SERVER_PUBLIC", "POD_IP", "PADDLE_NIC"):
        monkeypatch.delenv(name, raising=False)
    common = ("--servers", ",".join(SERVERS), "--workers", ",".join(WORKERS))
    with pytest.raises(ConfigError) as info:
        config_from_args(_args(*common))
    assert str(info.value).startswith(
        "this job spans several hosts, and fleetrun encrypts such a job (CURVE) so that nobody "
        "else on the network can read or push updates: make keys once with `fleetrun "
        "--make_keys DIR`")
    config = config_from_args(_args(*common, "--insecure"))
    assert (config.local_servers, config.local_workers, config.host, config.keys_dir) == (
        (1,), (1,), "10.9.0.2", None)
    make_keys(tmp_path / "keys")
    config = config_from_args(_args(*common, "--keys_dir", tmp_path / "keys"))
    assert config.keys_dir == str(tmp_path / "keys")
    env = process_environment(config, "server", 1, base={})
    assert env["FLEET_CURVE_KEYS_DIR"] == str(tmp_path / "keys")
    assert "FLEET_BIND_HOST" not in env
    with pytest.raises(ConfigError, match="--insecure and --keys_dir contradict each other"):
        config_from_args(_args(*common, "--insecure", "--keys_dir", tmp_path / "keys"))
    with pytest.raises(ConfigError, match="--keys_dir '/nonexistent/k': "):
        config_from_args(_args(*common, "--keys_dir", "/nonexistent/k"))


def test_pod_ip_names_this_host_and_its_servers_bind_every_interface(host_with, monkeypatch):
    host_with(["172.16.0.9"])
    monkeypatch.setenv("POD_IP", "10.9.0.1")
    config = config_from_args(_args("--servers", ",".join(SERVERS), "--workers",
                                    ",".join(WORKERS), "--insecure"))
    assert (config.local_servers, config.local_workers, config.bind_any) == ((0,), (0,), (0,))
    assert process_environment(config, "server", 0, base={})["FLEET_BIND_HOST"] == "0.0.0.0"


def test_workers_of_this_host_share_its_cores(host_with):
    host_with(["10.9.0.2"])
    config = LaunchConfig("train.py", server_endpoints=SERVERS, worker_endpoints=WORKERS,
                          local_servers=(1,), local_workers=(1,), host="10.9.0.2")
    env = process_environment(config, "worker", 1, base={})
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 1))
    assert env["PADDLE_TRAINER_ID"] == "1" and env["PADDLE_TRAINERS_NUM"] == "3"
    assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == ",".join(SERVERS)


def test_local_indexes_are_checked():
    with pytest.raises(ConfigError, match=r"local_workers=\[3\]: each must be a distinct index in 0..2"):
        LaunchConfig("t.py", server_endpoints=SERVERS, worker_endpoints=WORKERS,
                     local_servers=(), local_workers=(3,))
    with pytest.raises(ConfigError, match="give both local_servers and local_workers"):
        LaunchConfig("t.py", server_endpoints=SERVERS, worker_endpoints=WORKERS, local_servers=(0,))


def test_make_keys_writes_owner_only_files_and_never_overwrites(tmp_path):
    make_keys(str(tmp_path / "k"))
    for root, dirs, files in os.walk(tmp_path / "k"):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "k")) == [
        "authorized_clients", "client.key", "client.key_secret", "server.key", "server.key_secret"]
    with pytest.raises(ConfigError) as info:
        make_keys(str(tmp_path / "k"))
    assert str(info.value) == (f"--make_keys {str(tmp_path / 'k')!r} exists and is not empty; give a "
                               "new directory (keys are never overwritten)")
