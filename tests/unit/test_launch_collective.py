"""fleetrun --collective: workers only, each with PaddleCloudRoleMaker(is_collective=True)'s
variables; contradicting options are refused with the fix."""
import pytest

from fleet.errors import ConfigError
from fleet.launch.cli import build_parser, config_from_args, hosts_config_from_args
from fleet.launch.config import LaunchConfig, process_environment


def _config(*argv):
    return config_from_args(build_parser().parse_args([*argv, "train.py"]))


def test_collective_job_has_workers_only_with_the_collective_variables():
    config = _config("--collective", "--worker_num", "3", "--start_port", "7100")
    assert config.server_endpoints == () and not config.is_local
    assert config.worker_endpoints == ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")
    env = process_environment(config, "worker", 2, base={"TRAINING_ROLE": "PSERVER", "HOME": "/h"})
    assert {k: env[k] for k in env if k.startswith(("PADDLE_", "TRAINING_"))} == {
        "PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ENDPOINTS": ",".join(config.worker_endpoints),
        "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:7102", "PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "3"}
    assert env["HOME"] == "/h"
    assert len(_config("--collective").worker_endpoints) == 2  # the default


def test_collective_refuses_servers_with_the_fix():
    with pytest.raises(ConfigError, match="--collective trains without servers; leave out --server_num 2"):
        _config("--collective", "--server_num", "2")
    with pytest.raises(ConfigError, match="a collective job has no servers"):
        LaunchConfig("train.py", server_endpoints=("127.0.0.1:1",), worker_endpoints=("127.0.0.1:2",),
                     collective=True)
    with pytest.raises(ConfigError, match="--collective does not go with --hosts: start a collective job with "
                                          "the same `fleetrun --collective --workers"):
        hosts_config_from_args(build_parser().parse_args(["--hosts", "a,b", "--collective", "train.py"]))


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
