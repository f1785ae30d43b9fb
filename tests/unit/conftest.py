"""Fixtures shared by the unit tests of the fleet API."""
import pytest

import fleet
import fleet.base
import fleet.framework as fw
from fleet.launch import ROLE_VARIABLES


@pytest.fixture
def fresh_programs():
    """New default programs, names and global scope for the test."""
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        yield
    fw.reset_default_programs()


@pytest.fixture
def fresh_fleet(monkeypatch, fresh_programs):
    """A new Fleet singleton, no role variables, fresh default programs and global scope."""
    monkeypatch.setattr(fleet.base, "fleet", fleet.base.Fleet())
    for name in ROLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield
