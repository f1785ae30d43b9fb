"""Worker side of the wire: the contract (``api``), the parameter-server base (``base``) and
one module per strategy (``sync``, ``half_async``, ``asynchronous``, ``geo``, ``collective``,
``hybrid``), each
registered by mode for ``make_communicator``."""
from fleet.communicator import ops  # noqa: F401  (registers prefetch / send / geo_step)
from fleet.communicator.api import (
           CommunicatorAPI,
           communicator_class,
           make_communicator,
           modes,
           register,
)
from fleet.communicator.asynchronous import AsyncCommunicator
from fleet.communicator.base import Communicator
from fleet.communicator.collective import CollectiveCommunicator
from fleet.communicator.geo import GeoCommunicator
from fleet.communicator.half_async import HalfAsyncCommunicator
from fleet.communicator.hybrid import HybridCommunicator
from fleet.communicator.sync import SyncCommunicator

__all__ = ["AsyncCommunicator", "CollectiveCommunicator", "Communicator", "CommunicatorAPI", "GeoCommunicator",
           "HalfAsyncCommunicator", "HybridCommunicator", "SyncCommunicator", "communicator_class", "make_communicator",
           "modes", "register"]
