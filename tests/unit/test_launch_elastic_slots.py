"""fleetrun's elastic policy when the worker slots are held in etcd (--np with
--elastic_server), with a fake job and a fake slot registry: no processes, no etcd."""
import threading
from types import SimpleNamespace

from fleet.launch.config import LaunchConfig
from fleet.launch.elastic import ElasticPolicy


class _Child:
    def __init__(self, role, index, pid):
        self.role, self.index, self.popen = role, index, SimpleNamespace(pid=pid)
        self.returncode, self.stopped_by_us, self.tolerated = None, False, False
        self.endpoint = None

    name = property(lambda self: f"{self.role} {self.index}")
    label = property(lambda self: f"{self.name} (pid {self.popen.pid})")

    def error_line(self):
        return ""

    def describe_exit(self):
        return "was killed by SIGKILL" if self.returncode == -9 else f"exited with code {self.returncode}"


class _Slots:
    """What ElasticPolicy uses of a SlotRegistry; records every call."""

    def __init__(self, free=(), join_slots=()):
        self.free, self.join_slots, self.calls, self.done = list(free), tuple(join_slots), [], False
        self.why_none = ""

    def claim(self, count):
        taken, self.free = self.free[:count], self.free[count:]
        self.why_none = "" if len(taken) == count else "every one of the 4 worker slots (--np 2:4) is taken"
        self.calls.append(("claim", count, taken))
        return taken

    def release(self, index):
        self.calls.append(("release", index))

    def mark_done(self, index):
        self.calls.append(("done", index))
        self.done = True

    def data_done(self):
        return self.done


class _Job:
    def __init__(self, tmp_path, slots, local_servers=(0,), local_workers=(0,)):
        self.config = LaunchConfig("train.py", server_endpoints=("10.0.0.1:6170",),
                                   worker_endpoints=tuple(f"10.0.0.1:{p}" for p in range(6171, 6175)),
                                   local_servers=local_servers, local_workers=local_workers, host="10.0.0.1",
                                   log_dir=str(tmp_path), elastic=(2, 4))
        self.monitor = SimpleNamespace(slots=slots)
        self.exited = threading.Event()
        self.children, self.started = [], []
        for i in self.config.here("worker"):
            self.children.append(_Child("worker", i, 100 + i))
        self.elastic = ElasticPolicy(self)

    def start_process(self, role, index, append=False, extra_env=None):
        self.started.append((role, index, append, dict(extra_env or {})))
        child = _Child(role, index, 200 + index)
        self.children.append(child)
        return child


def test_a_worker_that_exits_0_marks_its_slot_done_once_and_a_lost_one_frees_its_slot(tmp_path, capsys):
    slots = _Slots()
    job = _Job(tmp_path, slots, local_workers=(0, 1))
    policy = job.elastic
    job.children[1].returncode = -9
    policy.tick()
    assert slots.calls == [("release", 1)] and job.children[1].tolerated
    assert "worker 1 (pid 101) was killed by SIGKILL: lost (elastic job --np 2:4)" in capsys.readouterr().err
    job.children[0].returncode = 0
    policy.tick()
    policy.tick()
    assert slots.calls == [("release", 1), ("done", 0)]
    assert policy.data_done()


def test_added_workers_take_slots_from_etcd_and_start_as_joining_ones(tmp_path, capsys):
    slots = _Slots(free=[3])
    job = _Job(tmp_path, slots)
    result = job.elastic.admit(2)
    assert result == {"admitted": [3], "refused": 1,
                      "why": "every one of the 4 worker slots (--np 2:4) is taken"}
    assert job.started == [("worker", 3, False, {"FLEET_ELASTIC_JOINING": "1"})]
    err = capsys.readouterr().err
    assert "started worker 3 (pid 203) (added on request, in a slot taken in etcd), endpoint" in err
    assert "refused 1 of 2 requested workers: every one of the 4 worker slots (--np 2:4) is taken" in err


def test_a_joining_host_starts_its_taken_slots_and_is_done_once_its_workers_ended(tmp_path):
    slots = _Slots(join_slots=(2, 3))
    job = _Job(tmp_path, slots, local_servers=(), local_workers=())
    policy = job.elastic
    assert not policy.workers_done()  # nothing started yet is not done
    policy.start()
    try:
        assert [(i, env) for _, i, _, env in job.started] == [(2, {"FLEET_ELASTIC_JOINING": "1"}),
                                                             (3, {"FLEET_ELASTIC_JOINING": "1"})]
        job.children[0].returncode = -9
        policy.tick()
        assert not policy.workers_done()
        job.children[1].returncode = 0
        policy.tick()
        assert policy.workers_done()  # a host of workers only leaves; the job goes on elsewhere
        assert slots.calls == [("release", 2), ("done", 3)]
    finally:
        policy.stop()


def test_a_host_with_a_server_waits_for_a_worker_to_finish_the_data(tmp_path):
    job = _Job(tmp_path, _Slots(), local_workers=(0,))
    job.children[0].returncode = -9
    job.elastic.tick()
    assert not job.elastic.workers_done()  # its server serves the other hosts' workers


def test_a_replacement_keeps_the_lost_workers_slot_in_etcd(tmp_path):
    slots = _Slots()
    job = _Job(tmp_path, slots, local_workers=(0, 1))
    job.config = type(job.config)(**{**job.config.__dict__, "worker_replacements": 1})
    policy = ElasticPolicy(job)
    job.elastic = policy
    job.children[1].returncode = -9
    policy.tick()
    assert job.started == [("worker", 1, True, {"FLEET_ELASTIC_JOINING": "1"})]
    assert slots.calls == []  # the slot stays live: its replacement runs in it
    job.children[2].returncode = -9
    policy.tick()
    assert slots.calls == [("release", 1)]  # no replacement left: now it is free


def test_a_host_of_workers_only_whose_every_worker_was_lost_fails_instead_of_saying_done(tmp_path, capsys):
    slots = _Slots(join_slots=(2, 3))
    job = _Job(tmp_path, slots, local_servers=(), local_workers=())
    policy = job.elastic
    policy.start()
    try:
        job.children[0].returncode = -9
        policy.tick()
        assert job.children[0].tolerated  # worker 3 still runs
        job.children[1].returncode = 1
        policy.tick()
        assert not any(ch.tolerated for ch in job.children)  # the job loop fails with worker 2 as the cause
        assert not policy.workers_done()
        assert ("every worker of this host was lost and none finished the data: worker 2 (was killed by SIGKILL), "
                "worker 3 (exited with code 1); this host leaves (the job goes on on the other hosts while --np "
                "2:4's minimum live)") in capsys.readouterr().err
    finally:
        policy.stop()
