"""Waits say what they wait for: WaitLog's schedule and text, and the waits that use it
(a worker waiting for servers, a request waiting for its reply, a server waiting for
workers)."""
import logging
import socket

import pytest

from fleet.errors import ConfigError, FleetTimeoutError
from fleet.logs import WaitLog, install_default_handler, wait_log_ms
from fleet.transport import Client, wait_for_servers


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wait_is_logged_after_the_first_delay_then_each_time_it_doubled_at_most_30_s_apart(caplog):
    clock = Clock()
    wait = WaitLog("servers 10.0.0.1:6170, 10.0.0.2:6170", limit="giving up after 60 s (FLEET_CONNECT_TIMEOUT_MS)",
                   first_s=5, clock=clock)
    logged = []
    with caplog.at_level(logging.INFO, logger="fleet"):
        for _ in range(261):  # 130 s in steps of 0.5 s
            text = wait.tick("1 of 2 answered; not yet 10.0.0.2:6170")
            if text:
                logged.append((round(clock.now - 100.0, 1), text))
            clock.now += 0.5
    assert [t for t, _ in logged] == [5.0, 10.0, 20.0, 40.0, 70.0, 100.0, 130.0]
    assert logged[0][1] == ("waiting for servers 10.0.0.1:6170, 10.0.0.2:6170 (1 of 2 answered; not yet "
                            "10.0.0.2:6170) for 5.0 s; giving up after 60 s (FLEET_CONNECT_TIMEOUT_MS)")
    assert [r.getMessage() for r in caplog.records] == [text for _, text in logged]


def test_next_due_says_when_a_blocked_waiter_should_wake_to_log():
    clock = Clock()
    wait = WaitLog("x", first_s=5, clock=clock)
    assert wait.next_due_s() == 5.0
    clock.now += 6
    assert wait.next_due_s() == 0.0 and wait.tick() == "waiting for x for 6.0 s"
    assert wait.next_due_s() == 6.0


def test_wait_log_ms_0_turns_the_messages_off_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "0")
    clock = Clock()
    wait = WaitLog("x", clock=clock)
    clock.now += 1000
    assert wait.tick() is None and wait.next_due_s() is None
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "soon")
    with pytest.raises(ConfigError) as e:
        wait_log_ms()
    assert str(e.value) == ("FLEET_WAIT_LOG_MS='soon' is not an integer >= 0; set FLEET_WAIT_LOG_MS to the "
                            "milliseconds a wait lasts before it is logged (0: never), or unset it to "
                            "use the default 5000")


def test_a_worker_waiting_for_a_server_that_is_not_there_says_so_before_its_error(monkeypatch, caplog):
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "100")
    endpoint = f"127.0.0.1:{_unused_port()}"
    with caplog.at_level(logging.INFO, logger="fleet"):
        with pytest.raises(FleetTimeoutError, match=rf"servers \['{endpoint}'\] did not answer within 1200 ms"):
            wait_for_servers([endpoint], timeout_ms=1200, retry_ms=300)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert waits, caplog.text
    assert waits[0].startswith(f"waiting for server {endpoint} (no answer yet) for ")
    assert waits[0].endswith(" s; giving up after 1.2 s (FLEET_CONNECT_TIMEOUT_MS)")


def test_a_request_whose_reply_is_late_says_whom_it_waits_for(monkeypatch, caplog):
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "100")
    endpoint = f"127.0.0.1:{_unused_port()}"
    with Client(endpoint, 3, timeout_ms=700) as client, caplog.at_level(logging.INFO, logger="fleet"):
        with pytest.raises(FleetTimeoutError):
            client.request("barrier")
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert waits, caplog.text
    assert waits[0].startswith(f"waiting for server {endpoint} to answer 'barrier' (request 1 of worker 3) for ")
    assert waits[0].endswith(" s; giving up after 700 ms (FLEET_RPC_TIMEOUT_MS or timeout_ms=)")


def test_the_default_handler_writes_fleet_info_to_stderr_unless_the_application_configured_logging(
        monkeypatch, capsys):
    logger = logging.getLogger("fleet")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    install_default_handler()
    install_default_handler()  # idempotent
    assert len(logger.handlers) == 1 and logger.level == logging.INFO
    logging.getLogger("fleet.server").info("server 0 listening on 127.0.0.1:6170")
    assert capsys.readouterr().err.endswith(" server 0 listening on 127.0.0.1:6170\n")
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])  # the application's own
    logging.getLogger("fleet.server").info("not twice")
    assert capsys.readouterr().err == ""


def test_a_training_thread_waiting_for_a_slow_pipe_command_says_which_file_it_waits_for(
        monkeypatch, caplog, tmp_path):
    import fleet
    import fleet.framework as fw
    from fleet import layers

    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "100")
    data = tmp_path / "part-0"
    data.write_text("1 0.5 1 1\n")
    with fw.program_guard(fw.Program(), fw.Program()):
        x = layers.data("x", shape=[1])
        y = layers.data("y", shape=[1], dtype="int64")
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var([x, y])
    ds.set_filelist([str(data)])
    ds.set_pipe_command("sleep 0.6; cat")
    with caplog.at_level(logging.INFO, logger="fleet"):
        batches = list(ds.batches(timeout=30))
    assert len(batches) == 1
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert waits, caplog.text
    assert waits[0].startswith(f"waiting for the dataset's next batch (producers: fleet-reader-0 reading "
                               f"{str(data)!r} (0 lines read)) for ")
    assert waits[0].endswith(" s; giving up after 30 s")
