"""fleetrun --max_restarts without processes: its settings, its decisions and its messages."""
import pytest

from fleet.errors import ConfigError
from fleet.launch import LaunchConfig, build_parser, config_from_args
from fleet.launch.config import restart_environment
from fleet.launch.restart import Failure, conclude, decide_restart, resume_point

ENDPOINTS = dict(server_endpoints=("127.0.0.1:6170",), worker_endpoints=("127.0.0.1:6171",))


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_restarts=-1), r"--max_restarts -1 must be a whole number >= 0 \(0: the first failure ends the job\)"),
    (dict(max_restarts=True), r"--max_restarts True must be a whole number >= 0"),
    (dict(restart_from_scratch=True), r"--restart_from_scratch only matters with --max_restarts K \(K >= 1\): "
                                      r"give both, or neither"),
])
def test_bad_restart_settings_are_errors_naming_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig("train.py", **ENDPOINTS, **kwargs)


def test_the_command_line_takes_paddles_name_too_and_each_process_learns_its_attempt(tmp_path):
    args = build_parser().parse_args(["--max_restart", "3", "--restart_from_scratch", "--log_dir", str(tmp_path),
                                      "--server_num", "1", "--worker_num", "1", "train.py"])
    config = config_from_args(args)
    assert (config.max_restarts, config.restart_from_scratch) == (3, True)
    assert restart_environment(config, 2) == {"FLEET_RESTART_COUNT": "2", "FLEET_MAX_RESTARTS": "3",
                                              "FLEET_RESTART_STATE_DIR": str(tmp_path / ".restart")}
    assert build_parser().parse_args(["train.py"]).max_restarts == 0


def _failure(attempt, role="server", index=0, how="was killed by SIGKILL", error=""):
    return Failure(attempt, role, index, "h1", 100 + attempt, how, error, 0.0)


def test_a_restart_is_said_and_logged_with_its_cause_and_checkpoint(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    failures = [_failure(0)]
    assert decide_restart(str(tmp_path), failures, 2, False, [str(tmp_path / "ckpt")]) is None
    err = capsys.readouterr().err
    assert err == (f"fleetrun: restart 1 of 2 (--max_restarts 2): server 0 (pid 100) on host h1 was killed by "
                   f"SIGKILL; every process was stopped and starts again with FLEET_RESTART_COUNT=1, resuming "
                   f"from the newest checkpoint: {tmp_path}/ckpt: none yet, so from the start\n")
    line = (tmp_path / "restarts.log").read_text()
    assert line.endswith(f"Z restart 1 of 2: server 0 (pid 100) on host h1 was killed by SIGKILL; resuming from "
                         f"the newest checkpoint: {tmp_path}/ckpt: none yet, so from the start\n")


def test_after_k_restarts_the_next_failure_gives_up_listing_all(tmp_path, capsys):
    failures = [_failure(0), _failure(1, "worker", 1, "exited with code 1", "RuntimeError: x")]
    assert decide_restart(str(tmp_path), failures, 1, False, ["/nowhere"]) == 1
    assert capsys.readouterr().err == (
        "fleetrun: exit 1: gave up after 1 restart (--max_restarts 1); 2 failures, in order:\n"
        "    1. attempt 0: server 0 (pid 100) on host h1 was killed by SIGKILL\n"
        "    2. attempt 1: worker 1 (pid 101) on host h1 exited with code 1: RuntimeError: x\n")


def test_a_job_without_checkpoints_restarts_only_from_scratch_when_asked(tmp_path, capsys):
    assert decide_restart(str(tmp_path), [_failure(0)], 2, False, []) == 1
    err = capsys.readouterr().err
    assert "no process of this job made a fleet.CheckpointConfig before it failed" in err
    assert err.endswith("fleetrun: exit 1: no restart (no checkpoint); the failure:\n"
                        "    1. attempt 0: server 0 (pid 100) on host h1 was killed by SIGKILL\n")
    assert decide_restart(str(tmp_path), [_failure(0)], 2, True, []) is None
    assert "FLEET_RESTART_COUNT=1, from scratch (--restart_from_scratch: the script makes no checkpoint)" in \
        capsys.readouterr().err


def test_a_job_that_succeeds_after_restarts_lists_what_it_survived(tmp_path, capsys):
    assert conclude(str(tmp_path), 0, [_failure(0)], 2) == 0
    assert capsys.readouterr().err == ("fleetrun: done after 1 restart; 1 failure, in order:\n"
                                       "    1. attempt 0: server 0 (pid 100) on host h1 was killed by SIGKILL\n")
    assert conclude(str(tmp_path), 0, [], 2) == 0 and capsys.readouterr().err == ""


def test_the_resume_point_names_the_newest_valid_checkpoint_or_a_damaged_directory(tmp_path):
    assert resume_point([]) == "from scratch (--restart_from_scratch: the script makes no checkpoint)"
    (tmp_path / "c" / "ckpt-7").mkdir(parents=True)  # no manifest: not a checkpoint
    assert resume_point([str(tmp_path / "c")]).startswith(
        f"resuming from the newest checkpoint: {tmp_path}/c: no valid checkpoint ({tmp_path}/c' holds checkpoints"
        .replace(f"({tmp_path}", f"('{tmp_path}"))


def test_np_with_max_restarts_is_an_elastic_job_that_restarts(tmp_path):
    """--np with --max_restarts: the elastic policy keeps lost workers' failures; the restart
    variables and FLEET_ELASTIC both reach every process."""
    from fleet.launch.config import process_environment
    args = build_parser().parse_args(["--np", "2:3", "--server_num", "1", "--max_restarts", "2",
                                      "--log_dir", str(tmp_path), "train.py"])
    config = config_from_args(args)
    assert (config.elastic, config.max_restarts, len(config.worker_endpoints)) == ((2, 3), 2, 3)
    env = {**process_environment(config, "worker", 2), **restart_environment(config, 1)}
    assert (env["FLEET_ELASTIC"], env["PADDLE_TRAINERS_NUM"], env["FLEET_RESTART_COUNT"]) == ("2:3", "3", "1")


def test_every_attempt_of_an_etcd_job_gets_the_rendezvous_monitor(tmp_path, monkeypatch):
    """--elastic_server with --max_restarts: each attempt watches the same formed plan."""
    from fleet.launch import local, restart
    seen = {}

    def fake_run_with_restarts(config, make_job, signals):
        seen["jobs"] = [make_job(attempt, 0.0) for attempt in (0, 1)]
        return 0

    monkeypatch.setattr(local, "_check_ready", lambda config: None)
    monkeypatch.setattr(restart, "run_with_restarts", fake_run_with_restarts)
    monitor = object()
    config = LaunchConfig("train.py", **ENDPOINTS, max_restarts=1, log_dir=str(tmp_path))
    assert local.launch(config, monitor=monitor) == 0
    assert [(job.monitor, job.attempt) for job in seen["jobs"]] == [(monitor, 0), (monitor, 1)]


def test_the_help_examples_keep_their_line_continuations():
    text = build_parser().format_help()
    for start in ("--workers 10.0.0.1:6171,10.0.0.2:6171 \\\n", "--worker_num_per_host 2 \\\n",
                  "--server_num 2 --worker_num 3 \\\n"):
        assert start in text
    assert "--np 2:4 --server_num 1 train.py --strategy async" in text
