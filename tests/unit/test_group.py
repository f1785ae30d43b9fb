"""The worker group with every rank a thread of this process (its own sockets, its own
ZeroMQ context): all_reduce / all_gather / broadcast equal numpy on random shapes, dtypes
and group sizes 2..5, on the direct, the ring (with tiny chunks, so segments of several
chunks and empty segments happen) and the shared-memory paths, whole and in rounds (the
threads are ranks on one host); results bit-identical on every rank; FLEET_GROUP_SHM=0 keeps ZeroMQ;
mismatches named by every rank; a rank that never joins, stops answering, vanishes
without a goodbye or closes early is named; CURVE keys let the job's workers in and
keep a worker without them out.
"""
import concurrent.futures
import functools
import logging
import queue
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from fleet.errors import ConfigError, FleetTimeoutError, PeerLostError, TransportError
from fleet.transport import group as group_module
from fleet.transport.curve import CurveConfig, generate_keys
from fleet.transport.group import WorkerGroup, group_from_env

DTYPES = ("float32", "float64", "int32", "int64")
PATHS = ("direct", "ring", "shm", "shm pipelined")
LIMIT_S = 30  # a test's own bound on one operation of every rank


class Ranks:
    """``size`` WorkerGroups, each created and used by a thread of its own.

    ``run(fn)`` calls ``fn(group)`` on every rank at once and returns the results in
    rank order; an exception of a rank is returned in its place.
    """

    def __init__(self, endpoints, ranks=None, curve=None, timeout_ms=10_000, **kw):
        self.endpoints = endpoints
        self.ranks = list(range(len(endpoints))) if ranks is None else list(ranks)
        self.pool = concurrent.futures.ThreadPoolExecutor(len(self.ranks))
        self.groups = {}
        self.queues = {r: queue.Queue() for r in self.ranks}
        curves = curve if isinstance(curve, dict) else dict.fromkeys(self.ranks, curve)
        self.threads = [threading.Thread(target=self._serve, args=(r, curves[r], timeout_ms, kw), daemon=True)
                        for r in self.ranks]
        for t in self.threads:
            t.start()

    def _serve(self, rank, curve, timeout_ms, kw):
        while True:
            fn, done = self.queues[rank].get()
            if fn is None:
                done.put(None)
                return
            try:
                done.put(fn(rank, curve, timeout_ms, kw))
            except BaseException as e:  # noqa: BLE001 - handed to the test
                done.put(e)

    def call(self, fn):
        """Runs fn(rank, curve, timeout_ms, kw) on every rank's thread; results in rank order."""
        dones = {r: queue.Queue() for r in self.ranks}
        for r in self.ranks:
            self.queues[r].put((fn, dones[r]))
        return [dones[r].get(timeout=LIMIT_S) for r in self.ranks]

    def join(self):
        def make(rank, curve, timeout_ms, kw):
            g = WorkerGroup(self.endpoints, rank, curve=curve, timeout_ms=timeout_ms)
            for key, value in kw.items():
                setattr(g, key, value)
            self.groups[rank] = g
            return g
        return self.call(make)

    def run(self, fn):
        return self.call(lambda rank, *_: fn(self.groups[rank]))

    def close(self):
        self.call(lambda rank, *_: self.groups[rank].close() if rank in self.groups else None)
        for r in self.ranks:
            self.queues[r].put((None, queue.Queue()))
        for t in self.threads:
            t.join(LIMIT_S)
        self.pool.shutdown()


class Custom:
    """A class of the tests: all_gather_object refuses to unpickle it."""


def ok(results):
    for r, value in enumerate(results):
        if isinstance(value, BaseException):
            raise AssertionError(f"rank {r} failed: {type(value).__name__}: {value}") from value
    return results


@pytest.fixture
def endpoints(free_ports):
    return lambda n: [f"127.0.0.1:{p}" for p in free_ports(n)]


@pytest.fixture
def group_of(endpoints):
    made = []

    def make(n, **kw):
        ranks = Ranks(endpoints(n), **kw)
        made.append(ranks)
        ok(ranks.join())
        return ranks

    yield make
    for ranks in made:
        ranks.close()


@pytest.fixture(scope="module")
def groups(free_ports_module):
    """One group of every size 2..5 for the property tests, kept across examples."""
    made = {}
    try:
        for n in range(2, 6):
            ranks = Ranks([f"127.0.0.1:{p}" for p in free_ports_module(n)])
            made[n] = ranks
            ok(ranks.join())
        yield made
    finally:
        for ranks in made.values():
            ranks.close()


@pytest.fixture(scope="module")
def free_ports_module():
    from tests.conftest import pick_free_ports
    return pick_free_ports


def set_path(ranks, path, chunk_bytes=64, round_bytes=24):
    """Every rank takes ``path`` at every size: "direct", "ring" (all_reduce, all_gather,
    broadcast), "shm" (all_reduce through shared memory; the others go directly) or "shm
    pipelined" (the same in rounds of ``round_bytes``: tiny, so a call has many rounds
    and reuses every staging buffer)."""
    assert path in PATHS, path

    def apply(g):
        assert g.shared_memory  # every rank is a thread of this process: one host
        g.ring_min_bytes = 0 if path == "ring" else 1 << 40
        g.shm_min_bytes = 0 if path.startswith("shm") else 1 << 40
        g.shm_pipeline_min_bytes = 0 if path == "shm pipelined" else 1 << 40
        g.shm_round_bytes = round_bytes
        g.chunk_bytes = chunk_bytes
    ok(ranks.run(apply))


def data(rank, dtype, shape, seed):
    rng = np.random.default_rng([seed, rank])
    if dtype.startswith("float"):
        return (rng.standard_normal(shape) * 100).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


@hsettings(max_examples=40)
@given(n=st.integers(2, 5), dtype=st.sampled_from(DTYPES), shape=shapes,
       op=st.sampled_from(("sum", "mean", "max", "min")), path=st.sampled_from(PATHS), seed=st.integers(0, 2**16))
def test_all_reduce_equals_numpy_and_is_bit_identical_on_every_rank(groups, n, dtype, shape, op, path, seed):
    if op == "mean" and not dtype.startswith("float"):
        op = "sum"
    ranks = groups[n]
    set_path(ranks, path)
    parts = [data(r, dtype, shape, seed) for r in range(n)]
    results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank].copy(), op)))
    ufunc = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}[op]
    expected = functools.reduce(ufunc, parts)  # rank order, as the direct exchange sums
    if op == "mean":
        expected = expected / np.array(n, dtype=dtype)
    for out in results:
        assert out.shape == shape and out.dtype == np.dtype(dtype)
        assert out.tobytes() == results[0].tobytes()
    if path == "ring" and op in ("sum", "mean") and dtype.startswith("float"):
        np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-3)
    else:
        np.testing.assert_array_equal(results[0], expected)


@hsettings(max_examples=25)
@given(n=st.integers(2, 5), dtype=st.sampled_from(DTYPES + ("uint8",)), rows=st.lists(st.integers(0, 7), min_size=5,
       max_size=5), tail=st.lists(st.integers(1, 4), max_size=2).map(tuple), ring=st.booleans(),
       seed=st.integers(0, 2**16))
def test_ragged_all_gather_equals_every_rank_s_array(groups, n, dtype, rows, tail, ring, seed):
    ranks = groups[n]
    set_path(ranks, "ring" if ring else "direct")
    parts = [data(r, dtype, (rows[r],) + tail, seed) if dtype != "uint8"
             else np.arange(rows[r] * int(np.prod(tail)), dtype=np.uint8).reshape((rows[r],) + tail)
             for r in range(n)]
    results = ok(ranks.run(lambda g: g.all_gather(parts[g.rank])))
    for gathered in results:
        assert len(gathered) == n
        for got, want in zip(gathered, parts):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


@hsettings(max_examples=20)
@given(n=st.integers(2, 5), dtype=st.sampled_from(DTYPES), shape=shapes, root=st.integers(0, 4),
       ring=st.booleans(), seed=st.integers(0, 2**16))
def test_broadcast_gives_the_root_s_array_everywhere(groups, n, dtype, shape, root, ring, seed):
    ranks = groups[n]
    set_path(ranks, "ring" if ring else "direct")
    root %= n
    sent = data(root, dtype, shape, seed)
    results = ok(ranks.run(lambda g: g.broadcast(sent if g.rank == root else None, root=root)))
    for out in results:
        assert out.dtype == sent.dtype and out.shape == sent.shape
        np.testing.assert_array_equal(out, sent)


def test_the_ring_path_with_many_chunks_per_segment_and_large_arrays(groups):
    ranks = groups[4]
    set_path(ranks, "ring", chunk_bytes=4096)
    parts = [data(r, "float32", (200_003,), 7) for r in range(4)]
    results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum")))
    np.testing.assert_allclose(results[0], sum(parts[1:], parts[0]), rtol=1e-5, atol=1e-3)
    assert len({r.tobytes() for r in results}) == 1
    # without shared memory the defaults choose by size: 512 KiB and more goes round the ring
    ok(ranks.run(lambda g: setattr(g, "ring_min_bytes", group_module.RING_MIN_BYTES)))
    ok(ranks.run(lambda g: setattr(g, "chunk_bytes", group_module.CHUNK_BYTES)))
    before = ok(ranks.run(lambda g: g.stats()["messages_sent"]))
    results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "max")))
    after = ok(ranks.run(lambda g: g.stats()["messages_sent"]))
    np.testing.assert_array_equal(results[2], np.maximum.reduce(parts))
    # ring (800 KB): 3 descriptors + 2 (N - 1) = 6 one-chunk segments (a quarter is < 1 MiB)
    assert [a - b for a, b in zip(after, before)] == [3 + 6] * 4
    small = [p[:1000] for p in parts]
    before = after
    results = ok(ranks.run(lambda g: g.all_reduce(small[g.rank], "min")))
    after = ok(ranks.run(lambda g: g.stats()["messages_sent"]))
    np.testing.assert_array_equal(results[0], np.minimum.reduce(small))
    assert [a - b for a, b in zip(after, before)] == [3] * 4  # direct: the array to each other rank


def _memfd_maps(name="fleet-group"):
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        return sum(f"memfd:{name} " in line for line in f)


def test_shared_memory_all_reduce_equals_the_direct_exchange_bit_for_bit_and_grows_its_segment(group_of):
    before_maps, before_controls = _memfd_maps(), _memfd_maps("fleet-group-control")
    ranks = group_of(3)
    assert ok(ranks.run(lambda g: g.shared_memory)) == [True] * 3  # threads of one process: one host
    assert _memfd_maps("fleet-group-control") == before_controls + 3  # rank 0 made it when joining, 1 and 2 map it
    for i, (size, op) in enumerate(((40_000, "sum"), (300_003, "mean"), (100, "max"), (300_003, "sum"), (0, "min"))):
        parts = [data(r, "float32", (size,), size) for r in range(3)]
        set_path(ranks, "direct")
        direct = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], op)))
        set_path(ranks, "shm")
        before = ok(ranks.run(lambda g: g.stats()))
        results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], op)))
        after = ok(ranks.run(lambda g: g.stats()))
        for r in range(3):
            assert results[r].tobytes() == direct[0].tobytes()  # rank order on every rank, as the direct exchange
            assert after[r]["shm_operations"] - before[r]["shm_operations"] == 1
            assert after[r]["bytes_sent"] == before[r]["bytes_sent"]  # no array goes over ZeroMQ
            # the ranks wait on each other in the control block: no ZeroMQ message at all
            assert after[r]["messages_sent"] == before[r]["messages_sent"]
    assert _memfd_maps() == before_maps + 3  # one mapping per rank (the grown segment; the first one is gone)
    # a failed call (here: shapes that differ) keeps the segment, but no rank writes its
    # slot of the next call before every rank has arrived in it (tested below with a rank
    # that fails alone)
    results = ranks.run(lambda g: g.all_reduce(np.zeros(100_000 + g.rank, np.float32), "sum"))
    assert all(isinstance(e, ConfigError) for e in results), results
    results = ok(ranks.run(lambda g: g.all_reduce(np.full(100_000, g.rank, np.int64), "sum")))
    np.testing.assert_array_equal(results[2], np.full(100_000, 3))
    assert _memfd_maps() == before_maps + 3
    ok(ranks.run(lambda g: g.close()))
    assert (_memfd_maps(), _memfd_maps("fleet-group-control")) == (before_maps, before_controls)


def test_shared_memory_adds_in_the_ring_order_from_ring_min_bytes_so_one_host_equals_several(group_of):
    # a collective job's parameters must not depend on whether its ranks share a host: from
    # ring_min_bytes on the shared-memory path adds as the ring would (3 ranks: (a+b)+c is not
    # (b+c)+a in float32), below it in rank order, as the direct exchange
    ranks = group_of(3)
    parts = [data(r, "float32", (30_001,), 7) for r in range(3)]
    zmq_bits = {}
    for path in ("direct", "ring"):
        set_path(ranks, path)
        zmq_bits[path] = [x.tobytes() for x in ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "mean")))]
    assert zmq_bits["direct"][0] != zmq_bits["ring"][0]  # the two orders differ in the last bits here

    def shm_with_ring_from(ring_min, pipeline_min):
        def run(g):
            g.shm_min_bytes, g.ring_min_bytes, g.shm_pipeline_min_bytes = 0, ring_min, pipeline_min
            g.shm_round_bytes = 3000  # 250 floats of each of the 3 parts per round: 41 rounds
            return g.all_reduce(parts[g.rank], "mean")
        return [x.tobytes() for x in ok(ranks.run(run))]
    for pipeline_min in (1 << 40, 0):  # whole, in rounds
        assert shm_with_ring_from(0, pipeline_min) == zmq_bits["ring"]
        assert shm_with_ring_from(1 << 40, pipeline_min) == zmq_bits["direct"]


def test_a_shared_memory_all_reduce_a_rank_never_joins_times_out_naming_it_and_the_group_goes_on(group_of):
    ranks = group_of(3)
    set_path(ranks, "shm")
    x = np.arange(1000, dtype=np.float64)
    ok(ranks.run(lambda g: g.all_reduce(x, "sum")))
    results = ranks.call(lambda rank, *_: ranks.groups[rank].all_reduce(x, "sum", timeout_ms=300) if rank != 2
                         else None)
    for r in (0, 1):
        assert isinstance(results[r], FleetTimeoutError), results[r]
        assert str(results[r]).startswith(f"rank 2 ({ranks.endpoints[2]}) did not answer rank {r} in all_reduce #2 "
                                          f"(rank {r} of 3) (shared memory: arriving) within 300 ms")
    # rank 2 comes late: ranks 0 and 1 gave up on that call, so it cannot take their
    # earlier arrival for one in this call
    error = ranks.call(lambda rank, *_: ranks.groups[rank].all_reduce(x, "sum", timeout_ms=300) if rank == 2
                       else None)[2]
    assert isinstance(error, FleetTimeoutError) and str(error).startswith(
        f"ranks 0 ({ranks.endpoints[0]}), 1 ({ranks.endpoints[1]}) did not answer rank 2 in all_reduce #2"), error
    results = ok(ranks.run(lambda g: g.all_reduce(x * (g.rank + 1), "sum")))
    for r in range(3):
        np.testing.assert_array_equal(results[r], x * 6)


def test_a_rank_whose_call_failed_does_not_overwrite_its_slot_while_a_slower_rank_still_reduces(group_of):
    # rank 0 gives up waiting for rank 2 (slow to reduce) and starts the next call at once
    # with other data: it must not copy that into its slot before rank 2 has read the old
    # one, or ranks 1 and 2 would get a wrong result of the first call
    ranks = group_of(3)
    set_path(ranks, "shm")
    first = [data(r, "float32", (40_000,), 5) for r in range(3)]
    second = [data(r, "float32", (40_000,), 6) for r in range(3)]
    ok(ranks.run(lambda g: g.all_reduce(first[g.rank], "sum")))  # every rank's last call succeeded
    slow = ranks.groups[2]
    reduce_now = slow._shm_reduce

    def reduce_late(*args):
        threading.Event().wait(0.6)
        return reduce_now(*args)
    slow._shm_reduce = reduce_late

    def two_calls(g):
        try:
            one = g.all_reduce(first[g.rank], "sum", timeout_ms=200 if g.rank == 0 else 10_000)
        except FleetTimeoutError as e:
            one = e
        slow.__dict__.pop("_shm_reduce", None)
        return one, g.all_reduce(second[g.rank], "sum")
    results = ok(ranks.run(two_calls))
    assert isinstance(results[0][0], FleetTimeoutError) and "(shared memory: reducing)" in str(results[0][0])
    expected = functools.reduce(np.add, first)  # rank order: below ring_min_bytes
    for r in (1, 2):
        assert results[r][0].tobytes() == expected.tobytes()
    for r in range(3):
        assert results[r][1].tobytes() == functools.reduce(np.add, second).tobytes()


def _stall(group, stage_start, seconds, least=None):
    """Makes ``group`` sleep ``seconds`` before its shared-memory waits whose stage starts
    with ``stage_start`` (and, given ``least``, that wait for that count)."""
    wait_now = group._shm_wait

    def wait_late(call, which, ranks, stage, *args, **kw):
        if stage.startswith(stage_start) and (least is None or kw.get("least") == least):
            threading.Event().wait(seconds)
        return wait_now(call, which, ranks, stage, *args, **kw)
    group._shm_wait = wait_late


def test_pipelined_calls_in_a_row_with_a_rank_late_to_its_last_round(group_of):
    # a rank that finished a call must not touch the counts a slower rank still waits on
    # there: ranks 0 and 1 leave each call while rank 2 still waits for the last round's
    # reductions, and start the next one
    ranks = group_of(3)
    set_path(ranks, "shm pipelined", round_bytes=3 * 400)  # 100 floats of each part per round
    parts = [data(r, "float32", (3_000,), 9) for r in range(3)]
    expected = functools.reduce(np.add, parts)  # rank order: below ring_min_bytes
    _stall(ranks.groups[2], "reducing piece 10 of 10", 0.2, least=10)
    results = ok(ranks.run(lambda g: [g.all_reduce(parts[g.rank], "sum") for _ in range(3)]))
    for outs in results:
        assert [out.tobytes() for out in outs] == [expected.tobytes()] * 3
    assert [s["shm_operations"] for s in ok(ranks.run(lambda g: g.stats()))] == [3, 3, 3]


def test_a_rank_that_stops_in_a_pipelined_call_is_named_with_its_round_and_the_next_call_is_right(group_of):
    ranks = group_of(3)
    set_path(ranks, "shm pipelined", round_bytes=3 * 400)
    parts = [data(r, "float32", (3_000,), 3) for r in range(3)]
    second = [data(r, "float32", (3_000,), 4) for r in range(3)]
    ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum")))
    _stall(ranks.groups[2], "copying in piece 4 of 10", 1.0)  # rank 2 reduces rounds 1-3, then gives up
    results = ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum", timeout_ms=400 if g.rank == 2 else 700))
    for r, error in enumerate(results):
        assert isinstance(error, FleetTimeoutError), error
    # rank 2 goes on past its deadline while what it waits for is there, up to the rounds
    # ranks 0 and 1 never copied in (they gave up)
    assert re.match(rf"ranks 0 \({ranks.endpoints[0]}\), 1 \({ranks.endpoints[1]}\) did not answer rank 2 in "
                    rf"all_reduce #2 \(rank 2 of 3\) \(shared memory: copying in piece ([5-9]|10) of 10\) within 400 ms",
                    str(results[2])), results[2]
    for r in (0, 1):  # they wait for rank 2's reduction of round 4, whose part only rank 2 reduces
        assert str(results[r]).startswith(f"rank 2 ({ranks.endpoints[2]}) did not answer rank {r} in all_reduce #2 "
                                          f"(rank {r} of 3) (shared memory: reducing piece 4 of 10)"), results[r]
    ranks.groups[2].__dict__.pop("_shm_wait")
    results = ok(ranks.run(lambda g: g.all_reduce(second[g.rank], "max")))
    for out in results:
        assert out.tobytes() == functools.reduce(np.maximum, second).tobytes()


def test_a_rank_in_another_operation_than_a_shared_memory_all_reduce_is_named_by_both(group_of):
    ranks = group_of(2)
    set_path(ranks, "shm")
    results = ranks.run(lambda g: g.all_reduce(np.zeros(3), "max") if g.rank == 0 else g.barrier())
    for error in results:
        assert isinstance(error, ConfigError), error
        assert "rank 0: all_reduce(op='max') of float64[3] (shm)" in str(error)
        assert "rank 1: barrier" in str(error)
    results = ok(ranks.run(lambda g: g.all_reduce(np.ones(3), "sum")))
    np.testing.assert_array_equal(results[1], [2.0, 2.0, 2.0])


def test_fleet_group_shm_0_takes_the_zeromq_path(group_of, endpoints, monkeypatch):
    monkeypatch.setenv("FLEET_GROUP_SHM", "0")
    ranks = group_of(2)
    assert ok(ranks.run(lambda g: g.shared_memory)) == [False, False]
    parts = [data(r, "float64", (100_000,), 3) for r in range(2)]  # 800 KB: direct (2 ranks, below 2 MiB)
    results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum")))
    np.testing.assert_array_equal(results[1], parts[0] + parts[1])
    stats = ok(ranks.run(lambda g: g.stats()))
    assert [(s["shm_operations"], s["bytes_sent"]) for s in stats] == [(0, 800_000)] * 2  # the array once to the other rank
    monkeypatch.setenv("FLEET_GROUP_SHM", "yes")
    with pytest.raises(ConfigError, match=r"FLEET_GROUP_SHM='yes' is neither 0 nor 1; set it to 0 to make"):
        WorkerGroup(endpoints(2), 0)


def test_two_ranks_exchange_directly_below_2_mib_and_go_round_the_ring_from_there(free_ports_module, monkeypatch):
    monkeypatch.setenv("FLEET_GROUP_SHM", "0")  # the ZeroMQ paths (ranks on other hosts)
    ranks = Ranks([f"127.0.0.1:{p}" for p in free_ports_module(2)])
    try:
        ok(ranks.join())
        assert ok(ranks.run(lambda g: g.ring_min_bytes)) == [group_module.TWO_RANK_RING_MIN_BYTES] * 2
        for floats, messages in ((400_000, 1), (600_000, 1 + 2)):  # 1.6 MB: direct; 2.4 MB: descriptor + 2 chunks
            parts = [data(r, "float32", (floats,), 3) for r in range(2)]
            before = ok(ranks.run(lambda g: g.stats()["messages_sent"]))
            results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum")))
            after = ok(ranks.run(lambda g: g.stats()["messages_sent"]))
            np.testing.assert_array_equal(results[0], parts[0] + parts[1])
            assert results[0].tobytes() == results[1].tobytes()
            assert [a - b for a, b in zip(after, before)] == [messages] * 2
    finally:
        ranks.close()


def test_the_input_is_not_modified_and_the_result_is_a_new_array(groups):
    ranks = groups[3]
    for path in PATHS:
        set_path(ranks, path)
        parts = [np.full((5, 4), r + 1.0, np.float32) for r in range(3)]
        copies = [p.copy() for p in parts]
        results = ok(ranks.run(lambda g: g.all_reduce(parts[g.rank], "sum")))
        for r in range(3):
            np.testing.assert_array_equal(parts[r], copies[r])
            assert not np.shares_memory(results[r], parts[r])
            np.testing.assert_array_equal(results[r], np.full((5, 4), 6.0, np.float32))


def test_a_large_ring_result_s_memory_is_reused_only_once_nothing_references_it(groups, monkeypatch):
    monkeypatch.setattr(group_module, "_SPARE_MIN_BYTES", 1)  # what 32 MiB arrays do, on small ones
    ranks = groups[2]
    set_path(ranks, "ring", chunk_bytes=4096)
    parts = [[data(r, "float64", (3000,), seed) for r in range(2)] for seed in range(5)]
    sums = [p[0] + p[1] for p in parts]  # two ranks: every order of the sum is the same

    def reduce(i):
        return ok(ranks.run(lambda g: g.all_reduce(parts[i][g.rank], "sum")))

    first = reduce(0)
    second = reduce(1)  # the first results are still held: new memory
    first_addresses = [a.ctypes.data for a in first]
    for r in range(2):
        assert not np.shares_memory(first[r], second[r])
        np.testing.assert_array_equal(first[r], sums[0])
    del first
    third = reduce(2)  # nothing references the first results any more: their memory comes back
    assert [a.ctypes.data for a in third] == first_addresses
    views = [s[10:20] for s in second]  # a view keeps the second results in use
    del second
    fourth = reduce(3)
    for r in range(2):
        assert not np.shares_memory(fourth[r], views[r]) and not np.shares_memory(fourth[r], third[r])
        np.testing.assert_array_equal(views[r], sums[1][10:20])
        np.testing.assert_array_equal(third[r], sums[2])
        np.testing.assert_array_equal(fourth[r], sums[3])


def test_barrier_and_all_gather_object(groups):
    ranks = groups[3]
    ok(ranks.run(lambda g: g.barrier()))
    objects = [{"rank": r, "auc": np.float64(0.5 + r), "rows": np.arange(r), "name": "w%d" % r, "t": (r, {r})}
               for r in range(3)]
    for path in ("direct", "ring"):
        set_path(ranks, path)
        results = ok(ranks.run(lambda g: g.all_gather_object(objects[g.rank])))
        for gathered in results:
            for got, want in zip(gathered, objects):
                assert got.keys() == want.keys()
                assert got["rank"] == want["rank"] and got["auc"] == want["auc"] and got["t"] == want["t"]
                np.testing.assert_array_equal(got["rows"], want["rows"])


@pytest.mark.parametrize("path", PATHS)
def test_mismatched_shapes_are_named_by_every_rank_and_the_group_goes_on(groups, path):
    ranks = groups[3]
    set_path(ranks, path)
    results = ranks.run(lambda g: g.all_reduce(np.zeros(4 + (g.rank == 1), np.float32), "sum"))
    for r, error in enumerate(results):
        assert isinstance(error, ConfigError), error
        text = str(error)
        assert f"all_reduce #" in text and f"(rank {r} of 3)" in text
        assert "rank 0: all_reduce(op='sum') of float32[4]" in text
        assert "rank 1: all_reduce(op='sum') of float32[5]" in text
        assert "rank 2: all_reduce(op='sum') of float32[4]" in text
    results = ok(ranks.run(lambda g: g.all_reduce(np.full(3, g.rank, np.int64), "sum")))
    np.testing.assert_array_equal(results[1], [3, 3, 3])


def test_different_operations_and_ops_are_named(groups):
    ranks = groups[2]
    set_path(ranks, "direct")
    results = ranks.run(lambda g: g.all_reduce(np.zeros(3), "max") if g.rank == 0 else g.barrier())
    for error in results:
        assert isinstance(error, ConfigError), error
        assert "rank 0: all_reduce(op='max') of float64[3] (direct)" in str(error)
        assert "rank 1: barrier" in str(error)
    results = ranks.run(lambda g: g.all_gather(np.zeros((2, 3 + g.rank), np.float32)))
    for error in results:
        assert isinstance(error, ConfigError) and "rank 1: all_gather of float32[2, 4]" in str(error), error
    # the root of a broadcast does not wait: only the receivers can name a mismatch
    results = ranks.run(lambda g: g.broadcast(np.zeros(2), root=0) if g.rank == 0 else g.all_reduce(np.ones(2)))
    assert isinstance(results[0], np.ndarray)
    assert isinstance(results[1], ConfigError) and "rank 0: broadcast(root=0) of float64[2]" in str(results[1])
    ok(ranks.run(lambda g: g.barrier()))


def test_bad_arguments_name_the_value_and_the_fix(group_of, endpoints):
    eps = endpoints(2)
    with pytest.raises(ConfigError, match=r"rank=2 is not an index of the 2 endpoints; pass an int in \[0, 2\)"):
        WorkerGroup(eps, 2)
    with pytest.raises(ConfigError, match="is listed twice"):
        WorkerGroup([eps[0], eps[0]], 0)
    with pytest.raises(ConfigError, match="worker endpoint"):
        WorkerGroup(["nohost"], 0)
    with pytest.raises(ConfigError, match="timeout_ms=0 is not a positive number"):
        WorkerGroup(eps[:1], 0, timeout_ms=0)
    ranks = group_of(2)
    g = ranks.groups[0]
    with pytest.raises(ConfigError, match="op='prod' is not one of sum, mean, max, min"):
        g.all_reduce(np.zeros(2), "prod")
    with pytest.raises(ConfigError, match="op='mean' of a int64 array would lose the fraction"):
        g.all_reduce(np.zeros(2, np.int64), "mean")
    with pytest.raises(ConfigError, match=r"dtype \|b1 \(bool\) is not one of float32, float64, int32, int64"):
        g.all_reduce(np.zeros(2, bool))
    with pytest.raises(ConfigError, match="got a list, not a numpy array"):
        g.all_reduce([1.0, 2.0])
    with pytest.raises(ConfigError, match=r"root=2 is not a rank of this group of 2; pass an int in \[0, 2\)"):
        g.broadcast(np.zeros(1), root=2)
    with pytest.raises(ConfigError, match="0-d array"):
        g.all_gather(np.float32(1.0) * np.ones(()))
    with pytest.raises(ConfigError, match="all_gather_object: dict object cannot be pickled"):
        g.all_gather_object({"lock": threading.Lock()})
    with pytest.raises(ConfigError, match=r"builtin types and numpy arrays only, not [\w.]*test_group.Custom"):
        g.all_gather_object([Custom()])


def test_a_group_of_one_needs_no_network(free_port):
    with WorkerGroup([f"127.0.0.1:{free_port()}"], 0) as g:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(g.all_reduce(x, "mean"), x)
        assert [a.tolist() for a in g.all_gather(x)] == [x.tolist()]
        np.testing.assert_array_equal(g.broadcast(x), x)
        assert g.all_gather_object("me") == ["me"]
        g.barrier()
    with pytest.raises(TransportError, match="the worker group is closed"):
        g.barrier()


def test_group_from_env_reads_paddle_s_variables(monkeypatch, free_port):
    monkeypatch.delenv("PADDLE_TRAINER_ENDPOINTS", raising=False)
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    with pytest.raises(ConfigError, match="PADDLE_TRAINER_ENDPOINTS is not set, but the worker group needs it"):
        group_from_env()
    endpoint = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", endpoint)
    with pytest.raises(ConfigError, match=r"PADDLE_TRAINER_ID is not set.*index in PADDLE_TRAINER_ENDPOINTS \(0 to 0\)"):
        group_from_env()
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    with pytest.raises(ConfigError, match="PADDLE_TRAINER_ID='1' is not an integer in"):
        group_from_env()
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    with group_from_env() as g:
        assert (g.rank, g.size, g.endpoints) == (0, 1, [endpoint])
    from role_makers import UserDefinedCollectiveRoleMaker
    with group_from_env(UserDefinedCollectiveRoleMaker(0, [endpoint])) as g:
        assert (g.rank, g.size) == (0, 1)


def test_ranks_with_other_endpoint_lists_are_refused(endpoints, monkeypatch):
    monkeypatch.setenv("FLEET_CONNECT_TIMEOUT_MS", "800")
    eps = endpoints(3)
    ranks = Ranks(eps[:2])
    try:
        results = ranks.call(lambda rank, *_: _try_group(eps[:2] if rank == 0 else eps, rank))
        assert isinstance(results[0], ConfigError), results[0]
        assert (f"rank 1 of the worker group was started with other endpoints than rank 0: it has {eps}, this rank "
                f"has {eps[:2]}; give every worker the same PADDLE_TRAINER_ENDPOINTS") in str(results[0])
        # rank 1 waits for rank 2 (never started) and maybe rank 0 (gone before its hello left)
        assert isinstance(results[1], FleetTimeoutError) and f"2 ({eps[2]}) did not answer rank 1" in str(results[1])
    finally:
        ranks.close()


def _try_group(eps, rank, **kw):
    try:
        return WorkerGroup(eps, rank, **kw)
    except Exception as e:  # noqa: BLE001 - returned to the test
        return e


def test_a_rank_that_never_starts_is_named_at_construction(endpoints, monkeypatch):
    monkeypatch.setenv("FLEET_CONNECT_TIMEOUT_MS", "600")
    eps = endpoints(3)
    ranks = Ranks(eps, ranks=[0, 1])
    try:
        results = ranks.call(lambda rank, *_: _try_group(eps, rank))
        for r, error in enumerate(results):
            assert isinstance(error, FleetTimeoutError), error
            assert f"rank 2 ({eps[2]}) did not answer rank {r} in joining the worker group within 600 ms" in str(error)
            assert "FLEET_CONNECT_TIMEOUT_MS" in str(error)
    finally:
        ranks.close()


def test_alive_check_ends_the_join_and_an_operation_with_its_error_before_the_timeout(group_of, endpoints,
                                                                                     monkeypatch):
    """A worker whose servers are lost stops waiting for ranks that will never answer."""
    from fleet.errors import ServerLostError

    lost = threading.Event()

    def servers_alive():
        if lost.is_set():
            raise ServerLostError("10.0.0.2:6170", "server 10.0.0.2:6170 stopped answering heartbeats")

    monkeypatch.setenv("FLEET_CONNECT_TIMEOUT_MS", "60000")
    eps = endpoints(2)
    lost.set()
    error = _try_group(eps, 0, alive_check=servers_alive)  # rank 1 never starts: not a 60 s FleetTimeoutError
    assert isinstance(error, ServerLostError) and "10.0.0.2:6170 stopped answering" in str(error)
    lost.clear()
    ranks = group_of(2)
    for rank in (0, 1):
        ranks.groups[rank]._alive_check = servers_alive
    lost.set()
    results = ranks.call(lambda rank, *_: ranks.groups[rank].barrier(timeout_ms=60000) if rank == 0 else None)
    assert isinstance(results[0], ServerLostError), results[0]
    with pytest.raises(ConfigError, match=r"alive_check=3 is not callable"):
        WorkerGroup(eps, 0, alive_check=3)


def test_an_operation_that_a_rank_never_joins_times_out_naming_it_and_logs_the_wait(group_of, monkeypatch, caplog):
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "100")
    ranks = group_of(3)
    caplog.set_level(logging.INFO, logger="fleet.transport")
    results = ranks.call(lambda rank, *_: ranks.groups[rank].barrier(timeout_ms=400) if rank != 2 else None)
    for r in (0, 1):
        assert isinstance(results[r], FleetTimeoutError), results[r]
        assert f"rank 2 ({ranks.endpoints[2]}) did not answer rank {r} in barrier #1 (rank {r} of 3) within 400 ms" \
            in str(results[r])
    assert any(f"waiting for rank 2 ({ranks.endpoints[2]}) in barrier #1" in m for m in caplog.messages), caplog.messages
    # rank 2's late barrier message is dropped as stale by the others; the groups then go on
    # (its own barrier passes at once: the others' messages of operation 1 were waiting for it)
    assert ok(ranks.call(lambda rank, *_: ranks.groups[rank].barrier(timeout_ms=400) if rank == 2 else None)) \
        == [None] * 3
    set_path(ranks, "direct")  # over ZeroMQ, where the stale message is read and dropped
    results = ok(ranks.run(lambda g: g.all_reduce(np.ones(2), "sum")))
    np.testing.assert_array_equal(results[0], [3.0, 3.0])
    assert [ranks.groups[r].stats()["stale_messages"] for r in range(3)] == [1, 1, 0]


def test_a_rank_gone_without_goodbye_is_named_by_the_others_while_they_wait(group_of, monkeypatch):
    monkeypatch.setenv("FLEET_HEARTBEAT_MS", "100")
    monkeypatch.setenv("FLEET_HEARTBEAT_TIMEOUT_MS", "500")
    ranks = group_of(3)
    # rank 1 vanishes (its sockets and context closed at once, as when its process dies)
    results = ranks.call(lambda rank, *_: ranks.groups[rank]._teardown() if rank == 1
                         else ranks.groups[rank].all_reduce(np.ones(100_000, np.float32)))
    for r in (0, 2):
        error = results[r]
        assert isinstance(error, PeerLostError), error
        assert (error.rank, error.endpoint) == (1, ranks.endpoints[1])
        assert f"rank 1 ({ranks.endpoints[1]}) of the worker group is lost" in str(error)
        # every later call fails the same way at once
        again = ranks.groups[r]
        with pytest.raises(PeerLostError, match="rank 1"):
            again.barrier()
    ranks.groups[1]._closed = True


def test_a_rank_that_closes_while_another_waits_is_named(group_of):
    ranks = group_of(2)

    def barrier_then_close(g):
        try:
            return g.barrier(timeout_ms=5000)
        except TransportError as e:
            return e
        finally:
            g.close()  # rank 1's close waits for this goodbye

    results = ranks.call(lambda rank, *_: ranks.groups[rank].close() if rank == 1
                         else barrier_then_close(ranks.groups[rank]))
    assert isinstance(results[0], TransportError)
    assert f"rank 1 ({ranks.endpoints[1]}) closed the worker group while rank 0 waits for it in barrier #1" \
        in str(results[0])


def test_curve_keys_let_the_workers_in(tmp_path, group_of):
    keys = generate_keys(str(tmp_path / "keys"))
    ranks = group_of(3, curve=keys)
    set_path(ranks, "ring", chunk_bytes=1024)
    results = ok(ranks.run(lambda g: g.all_reduce(np.arange(5000, dtype=np.float64) * g.rank, "sum")))
    np.testing.assert_array_equal(results[2], np.arange(5000) * 3.0)


def test_a_worker_without_the_keys_cannot_join(tmp_path, endpoints, monkeypatch):
    monkeypatch.setenv("FLEET_CONNECT_TIMEOUT_MS", "1500")
    keys = generate_keys(str(tmp_path / "keys"))
    eps = endpoints(3)
    ranks = Ranks(eps, curve={0: keys, 1: keys, 2: None})
    try:
        results = ranks.call(lambda rank, curve, *_: _try_group(eps, rank, curve=curve))
        for r in (0, 1):
            assert isinstance(results[r], FleetTimeoutError), results[r]
            assert f"rank 2 ({eps[2]}) did not answer rank {r} in joining the worker group" in str(results[r])
            assert "This rank uses CURVE" in str(results[r])
        assert isinstance(results[2], FleetTimeoutError)
        assert f"ranks 0 ({eps[0]}), 1 ({eps[1]}) did not answer rank 2" in str(results[2])
        assert "needs the same keys" in str(results[2])
    finally:
        ranks.close()
    other = CurveConfig(keys.server_public, client_public=keys.server_public, client_secret=keys.server_secret)
    with pytest.raises(ConfigError, match="client key pair is missing"):
        WorkerGroup(endpoints(2), 0, curve=CurveConfig(keys.server_public))
    assert other.client_public != keys.client_public
