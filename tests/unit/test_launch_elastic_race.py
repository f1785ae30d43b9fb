"""fleetrun's job loop when a worker of an elastic job exits between the loop's elastic
tick and its failure check: the elastic policy still decides (lost, not the job's root
cause); and when a process told of another's failure exits before it. Fake processes; no
process is started."""
import threading
import time
from types import SimpleNamespace

from fleet.launch import local
from fleet.launch.config import LaunchConfig
from fleet.launch.elastic import ElasticPolicy


class _Child:
    def __init__(self, role, index):
        self.role, self.index, self.popen = role, index, SimpleNamespace(pid=100 + index)
        self.returncode, self.exit_time, self.stopped_by_us, self.tolerated = None, None, False, False
        self.endpoint = None
        self.error = ""

    name = property(lambda self: f"{self.role} {self.index}")
    label = property(lambda self: f"{self.name} (pid {self.popen.pid})")
    failed = local._Child.failed

    def exit(self, code):
        self.returncode, self.exit_time = code, time.monotonic()

    def error_line(self):
        return self.error

    def describe_exit(self):
        return "was killed by SIGKILL" if self.returncode == -9 else f"exited with code {self.returncode}"


class _Job:
    """What _Job._first_failure and ElasticPolicy use of a job."""

    def __init__(self, tmp_path, low, workers=3, elastic=True):
        self.config = LaunchConfig("train.py", server_endpoints=("127.0.0.1:6170",),
                                   worker_endpoints=tuple(f"127.0.0.1:{6171 + i}" for i in range(workers)),
                                   log_dir=str(tmp_path), elastic=(low, workers) if elastic else None,
                                   initial_workers=workers if elastic else None)
        self.monitor = None
        self.exited = threading.Event()
        self.children = [_Child("server", 0)] + [_Child("worker", i) for i in range(workers)]
        self.elastic = ElasticPolicy(self) if elastic else None

    first_failure = local._Job._first_failure


def test_a_worker_lost_after_the_loops_tick_is_tolerated_not_the_root_cause(tmp_path, capsys):
    job = _Job(tmp_path, low=2)
    job.elastic.tick()  # the loop's tick: nothing has exited yet
    job.children[2].exit(-9)  # worker 1 dies right after it
    assert job.first_failure() is None
    assert job.children[2].tolerated and job.elastic.lost == [job.children[2]]
    assert "worker 1 (pid 101) was killed by SIGKILL: lost (elastic job --np 2:3)" in capsys.readouterr().err


def test_below_min_after_the_loops_tick_the_first_lost_worker_is_the_root_cause(tmp_path, capsys):
    job = _Job(tmp_path, low=3)
    job.elastic.tick()
    job.children[2].exit(-9)
    assert job.first_failure() is job.children[2]
    assert "only 2 workers left, fewer than --np 3:3's minimum 3: the job fails" in capsys.readouterr().err


def test_without_elastic_the_earliest_failure_is_the_root_cause(tmp_path):
    job = _Job(tmp_path, low=2, elastic=False)
    assert job.first_failure() is None
    job.children[3].exit(1)
    job.children[1].exit(-9)
    assert job.first_failure() is job.children[3]


def test_a_worker_told_of_another_s_failure_that_exits_first_is_not_the_root_cause(tmp_path):
    # worker 1 failed and told the servers; the server failed the job and worker 0, told so,
    # exited while worker 1 was still tearing down: worker 1 is the root cause
    job = _Job(tmp_path, low=2, elastic=False)
    job.children[1].error = ("fleet.errors.ServerError: server 127.0.0.1:6170 failed: worker 1 was lost: it failed: "
                             "DataError: worker 1 of 3: train_from_dataset ran a pass over 0 examples")
    job.children[1].exit(1)
    job.children[2].error = "fleet.errors.DataError: worker 1 of 3: train_from_dataset ran a pass over 0 examples"
    job.children[2].exit(1)
    assert job.first_failure() is job.children[2]
    # a process it names that did not fail (yet) does not count: the earliest stays the cause
    job = _Job(tmp_path, low=2, elastic=False)
    job.children[1].error = "fleet.errors.ServerError: server 127.0.0.1:6170 failed: worker 2 was lost: it failed"
    job.children[1].exit(1)
    assert job.first_failure() is job.children[1]
