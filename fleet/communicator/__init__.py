"""Worker side of the wire: the sync, async, half-async and GEO communicators."""
from fleet.communicator import ops  # noqa: F401  (registers prefetch / send / geo_step)
from fleet.communicator.base import Communicator
from fleet.communicator.communicators import (AsyncCommunicator, GeoCommunicator,
                                              HalfAsyncCommunicator, SyncCommunicator,
                                              make_communicator)
