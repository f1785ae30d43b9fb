"""fleet.launch.replacement: where a lost host's ranks go."""
import pytest

from fleet.errors import ConfigError
from fleet.launch.replacement import Move, Share, reassign


def _job():
    return {"h1": Share((0,), (0,)), "h2": Share((1,), (1,)), "h3": Share((), (2,))}


def test_a_lost_host_moves_its_server_to_a_server_host_and_its_worker_to_a_worker_host():
    shares, moves = reassign(_job(), {"h2"})
    assert shares == {"h1": Share((0, 1), (0, 1)), "h3": Share((), (2,))}
    assert moves == [Move("server", 1, "h2", "h1"), Move("worker", 1, "h2", "h1")]


def test_ties_go_to_the_first_host_and_every_rank_is_placed_once():
    shares, moves = reassign(_job(), {"h2"})
    assert [m.describe() for m in moves] == ["server 1 from h2 to h1", "worker 1 from h2 to h1"]
    placed_servers = sorted(i for s in shares.values() for i in s.servers)
    placed_workers = sorted(i for s in shares.values() for i in s.workers)
    assert (placed_servers, placed_workers) == ([0, 1], [0, 1, 2])


def test_lost_ranks_spread_over_the_hosts_that_ran_the_role():
    job = [("a", Share((0,), (0,))), ("b", Share((1, 2), (1,))), ("c", Share((3,), (2,))),
           ("d", Share((), (3, 4)))]
    shares, moves = reassign(job, {"b"})
    assert shares["a"].servers == (0, 1) and shares["c"].servers == (2, 3)
    assert shares["a"].workers == (0, 1) and shares["d"].workers == (3, 4)
    assert list(shares) == ["a", "c", "d"]


def test_servers_go_to_the_least_loaded_host_when_no_survivor_ran_servers():
    job = {"s": Share((0, 1), ()), "w1": Share((), (0, 1)), "w2": Share((), (2,))}
    shares, _ = reassign(job, {"s"})
    assert shares == {"w1": Share((1,), (0, 1)), "w2": Share((0,), (2,))}


def test_losing_every_host_or_an_unknown_one_is_an_error_naming_them():
    with pytest.raises(ConfigError, match=r"every host of the job is lost \(h1, h2, h3\)"):
        reassign(_job(), {"h1", "h2", "h3"})
    with pytest.raises(ConfigError, match=r"lost host\(s\) h9 are not in the job \(its hosts: h1, h2, h3\)"):
        reassign(_job(), {"h9"})


def test_nothing_lost_changes_nothing():
    shares, moves = reassign(_job(), set())
    assert shares == _job() and moves == []
