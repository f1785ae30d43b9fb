"""Fixtures of the cluster tests: hosts as network namespaces on one machine.

``cluster_factory(n, sshd=False)`` returns a started :class:`tests.cluster.netns.Cluster`
of n hosts, torn down at the test's teardown whatever happened (also on Ctrl-C: see
tests/cluster/netns.py). These tests need root, iproute2 and OpenSSH; where one is
missing they fail (never skip) with a message naming it and the fix.
"""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # `from tests.cluster.netns import ...` also under plain `pytest`
    sys.path.insert(0, _ROOT)

from tests.cluster.netns import Cluster, missing_requirements  # noqa: E402


@pytest.fixture
def cluster_factory():
    """make(n_hosts, sshd=False) -> a started Cluster, removed at teardown."""
    made = []

    def make(n_hosts, sshd=False):
        missing = missing_requirements(sshd)
        if missing:
            pytest.fail("the cluster tests cannot run here; missing: " + "; ".join(missing),
                        pytrace=False)
        cluster = Cluster(n_hosts, sshd=sshd)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in reversed(made):
            cluster.close()


@pytest.fixture(scope="session")
def ctr_data(tmp_path_factory):
    """CTR-DNN train/test data for the cluster tests (tests/cluster/ctr.py)."""
    from tests.cluster import ctr
    return ctr.make_data(tmp_path_factory.mktemp("ctr") / "data")


@pytest.fixture(scope="session")
def ctr_keys(tmp_path_factory):
    """A CTR job's CURVE key directory (fleetrun --make_keys)."""
    from tests.cluster import ctr
    return ctr.make_keys(tmp_path_factory.mktemp("keys") / "k")
