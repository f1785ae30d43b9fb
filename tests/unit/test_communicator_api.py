"""The communicator contract (fleet.communicator.api): the registry by mode, the errors."""
import pytest

from fleet.communicator import (AsyncCommunicator, CommunicatorAPI, GeoCommunicator,
                                HalfAsyncCommunicator, SyncCommunicator, communicator_class, modes,
                                register)
from fleet.errors import ConfigError


def test_every_strategy_is_registered_by_its_mode():
    assert modes() == ["async", "collective", "geo", "half_async", "hybrid", "sync"]
    assert [communicator_class(m) for m in ("sync", "half_async", "async", "geo")] == [
        SyncCommunicator, HalfAsyncCommunicator, AsyncCommunicator, GeoCommunicator]
    assert all(issubclass(communicator_class(m), CommunicatorAPI) for m in modes())
    assert SyncCommunicator.requires_thread_barrier and not AsyncCommunicator.requires_thread_barrier


def test_an_unknown_mode_names_itself_and_the_modes():
    with pytest.raises(ConfigError) as info:
        communicator_class("nccl")
    assert str(info.value) == (
        "no communicator for training mode 'nccl': the modes are 'async', 'collective', 'geo', 'half_async', "
        "'hybrid', 'sync'; build the strategy with DistributedStrategyFactory (create_sync_strategy(), ...)")


def test_a_mode_cannot_be_registered_twice():
    with pytest.raises(ConfigError, match="communicator mode 'sync' is registered twice: "
                                          "SyncCommunicator and Other"):
        @register("sync")
        class Other(SyncCommunicator):
            pass
    assert communicator_class("sync") is SyncCommunicator


def test_the_contract_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        CommunicatorAPI()
