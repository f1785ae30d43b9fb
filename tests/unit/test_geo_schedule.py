"""GEO's exchange schedule: after 1, 2, 4, ... steps, doubling up to update_frequency; a
pass shorter than update_frequency is logged once with the figures and the fix."""
import logging

import fleet.framework as fw
from fleet.communicator.geo import GeoCommunicator
from test_communicator_liveness import _plan


def _geo(k, monkeypatch):
    comm = GeoCommunicator(_plan("geo", "127.0.0.1:9"), 0, fw.Scope(), {}, connect=None, update_frequency=k)
    exchanged = []
    monkeypatch.setattr(comm, "_exchange", lambda: (exchanged.append(comm._steps), setattr(comm, "_steps", 0)))
    return comm, exchanged


def test_exchanges_come_after_1_2_4_steps_then_every_update_frequency(monkeypatch):
    comm, exchanged = _geo(8, monkeypatch)
    ends = []
    for step in range(1, 41):
        comm.geo_step({})
        if len(exchanged) > len(ends):
            ends.append(step)
    assert ends == [1, 3, 7, 15, 23, 31, 39]
    assert exchanged == [1, 2, 4, 8, 8, 8, 8]


def test_a_pass_shorter_than_update_frequency_is_logged_once(monkeypatch, caplog):
    comm, exchanged = _geo(100, monkeypatch)
    for _ in range(2):
        comm.begin_pass(1)
        for _ in range(50):
            comm.geo_step({})
        with caplog.at_level(logging.WARNING, logger="fleet"):
            comm.end_pass()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "fleet: GEO worker 0 ran 50 steps this pass, fewer than update_frequency=100: it exchanged with the "
        "servers only during the first steps (after 1, 2, 4, ... steps) and at the end of the pass, so the "
        "workers trained apart in between; set update_frequency to at most 12 (a quarter of a pass) to "
        "average them regularly"]
    # the end of each pass sends what is left; the doubling goes on across passes
    assert exchanged == [1, 2, 4, 8, 16, 19, 32, 18]
