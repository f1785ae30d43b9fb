"""fleetrun --collective: workers only, each with PaddleCloudRoleMaker(is_collective=True)'s
variables; contradicting options are refused with the fix."""
import pytest

from fleet.errors import ConfigError
from fleet.launch.cli import build_parser, config_from_args, hosts_config_from_args
from fleet.launch.config import LaunchConfig, process_environment


def _config(*argv):
    return config_from_args(build_parser().parse_args([*argv, "train.py"]))


def _hosts(*argv):
    return hosts_config_from_args(build_parser().parse_args([*argv, "--collective", "--workspace", "/w",
                                                             "train.py"]))


def test_collective_job_has_workers_only_with_the_collective_variables():
    config = _config("--collective", "--worker_num", "3", "--start_port", "7100")
    assert config.server_endpoints == () and not config.is_local
    assert config.worker_endpoints == ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")
    env = process_environment(config, "worker", 2, base={"TRAINING_ROLE": "PSERVER", "HOME": "/h"})
    assert {k: env[k] for k in env if k.startswith(("PADDLE_", "TRAINING_"))} == {
        "PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ENDPOINTS": ",".join(config.worker_endpoints),
        "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:7102", "PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "3"}
    assert env["HOME"] == "/h"
    assert env["FLAGS_selected_gpus"] == "2"  # its rank on this host, for a GPU script's CUDAPlace
    assert process_environment(config, "worker", 1, base={"FLAGS_selected_gpus": "5"})["FLAGS_selected_gpus"] == "5"
    assert "FLAGS_selected_gpus" not in process_environment(_config("--worker_num", "2", "--server_num", "1"),
                                                            "worker", 1, base={})
    assert len(_config("--collective").worker_endpoints) == 2  # the default


def test_collective_refuses_servers_with_the_fix():
    with pytest.raises(ConfigError, match="--collective trains without servers; leave out --server_num 2"):
        _config("--collective", "--server_num", "2")
    with pytest.raises(ConfigError, match="a collective job has no servers"):
        LaunchConfig("train.py", server_endpoints=("127.0.0.1:1",), worker_endpoints=("127.0.0.1:2",),
                     collective=True)
    with pytest.raises(ConfigError, match="^--server_num_per_host 1 with --collective: a collective job has no "
                                          "servers"):
        _hosts("--hosts", "a,b", "--server_num_per_host", "1")


def test_the_collective_environment_needs_the_collective_role_maker(monkeypatch):
    from role_makers import PaddleCloudRoleMaker
    from fleet.errors import RoleError

    config = _config("--collective", "--worker_num", "2", "--start_port", "7100")
    for key, value in process_environment(config, "worker", 1, base={}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TRAINING_ROLE", raising=False)
    rm = PaddleCloudRoleMaker(is_collective=True)
    assert rm.worker_index() == 1 and rm.worker_num() == 2 and rm.get_pserver_endpoints() == []
    with pytest.raises(RoleError, match="this is a collective job \\(fleetrun --collective\\); create the role "
                                        "maker with PaddleCloudRoleMaker\\(is_collective=True\\)"):
        PaddleCloudRoleMaker().generate_role()


def test_a_collective_job_across_hosts_runs_the_per_host_fleetrun_collective_on_each(tmp_path, monkeypatch):
    import shlex

    import fleet.launch.hosts as H
    from fleet.launch.hostfile import plan_endpoints
    from fleet.launch.remote import Remote
    from fleet.launch import this_host

    config = _hosts("--hosts", "a,b", "--worker_num_per_host", "2", "--insecure")
    assert config.collective and config.counts(0) == (0, 2) and config.counts(1) == (0, 2)
    job = H._HostsJob(config, signals=None)
    job.addresses = ["10.0.0.1", "10.0.0.2"]
    job.servers, job.workers = plan_endpoints(job.addresses, 0, 2, config.start_port)
    assert job.workers == ["10.0.0.1:6170", "10.0.0.1:6171", "10.0.0.2:6170", "10.0.0.2:6171"]
    remote = Remote(config.hosts[1], 1, {"workspace": "/w"}, "10.0.0.2", "log/b")
    command = job._remote_command(remote)
    assert "--servers" not in command
    assert (" -m fleet.launch --collective --workers 10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171 "
            "--host 10.0.0.2 --log_dir log/b --stop_on_stdin_eof ") in command
    # the per-host fleetrun that command runs takes it as a collective job of 4 workers, 2 here
    monkeypatch.setattr(this_host, "interface_addresses", lambda nic=None: {"127.0.0.1", "10.0.0.2"})
    argv = shlex.split(command)
    here = config_from_args(build_parser().parse_args(argv[argv.index("fleet.launch") + 1:]))
    assert here.collective and here.server_endpoints == () and len(here.worker_endpoints) == 4
    assert (here.local_workers, here.bind_any_workers, here.host) == ((2, 3), (), "10.0.0.2")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a workers=2\nb servers=0\n")
    assert [_hosts("--hosts", str(hostfile)).counts(i) for i in range(2)] == [(0, 2), (0, 1)]
    hostfile.write_text("a workers=2\nb servers=1\n")
    with pytest.raises(ConfigError) as info:
        _hosts("--hosts", str(hostfile))
    assert str(info.value) == (f"hostfile {hostfile} line 2: servers=1 in a collective job (--collective), which "
                               "has no servers; remove servers=N from the hostfile, or drop --collective")
    with pytest.raises(ConfigError, match="^a collective --hosts job needs workers: give --worker_num_per_host 1"):
        _hosts("--hosts", "a,b", "--worker_num_per_host", "0")


def test_a_collective_worker_whose_address_is_not_here_binds_the_wildcard(monkeypatch):
    """A worker binds its endpoint (the workers' group); an address the host is known by
    but does not carry (--host / POD_IP) is advertised while it binds every interface."""
    from fleet.launch import this_host

    monkeypatch.setattr(this_host, "interface_addresses", lambda nic=None: {"127.0.0.1", "172.16.0.9"})
    monkeypatch.delenv("POD_IP", raising=False)
    workers = "10.9.0.1:6170,10.9.0.2:6170"
    config = _config("--collective", "--workers", workers, "--host", "10.9.0.2", "--insecure")
    assert (config.local_workers, config.bind_any_workers, config.host) == ((1,), (1,), "10.9.0.2")
    env = process_environment(config, "worker", 1, base={})
    assert env["FLEET_BIND_HOST"] == "0.0.0.0" and env["PADDLE_CURRENT_ENDPOINT"] == "10.9.0.2:6170"
    # a parameter-server job's workers too (their group serves fleet.metrics)
    config = _config("--servers", "10.9.0.1:6171", "--workers", workers, "--host", "10.9.0.2", "--insecure")
    assert process_environment(config, "worker", 1, base={})["FLEET_BIND_HOST"] == "0.0.0.0"
    # an address on an interface here binds itself
    monkeypatch.setattr(this_host, "interface_addresses", lambda nic=None: {"127.0.0.1", "10.9.0.2"})
    config = _config("--collective", "--workers", workers, "--insecure")
    assert config.bind_any_workers == () and "FLEET_BIND_HOST" not in process_environment(config, "worker", 1,
                                                                                           base={})
    with pytest.raises(ConfigError, match=r"^bind_any_workers=\[0\] names workers that do not run here"):
        LaunchConfig("train.py", worker_endpoints=workers.split(","), collective=True, local_servers=(),
                     local_workers=(1,), bind_any_workers=(0,))
