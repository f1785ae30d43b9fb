"""Strategies: how to train (mode, parameter placement, communicator flags, threads).

Plain, validated settings objects (layer 2): they read only ``os.environ`` (CPU_NUM and
FLAGS_*). Names and defaults are PaddlePaddle Fleet 1.7's:

- `DistributedStrategyFactory` (alias `StrategyFactory`): ``create_sync_strategy()``,
  ``create_async_strategy()``, ``create_half_async_strategy()``,
  ``create_geo_strategy(update_frequency=100)``, ``create_collective_strategy()``,
  ``create_hybrid_strategy()``.
- `CollectiveStrategy` (Paddle 1.x's ``fleet.collective.DistributedStrategy`` fields; no
  servers) and `HybridStrategy` (dense all-reduced, tables on servers).
- `DistributeTranspilerConfig`, `TrainerRuntimeConfig`, `ServerRuntimeConfig`,
  `ExecutionStrategy`, `BuildStrategy`: the settings a strategy bundles.
- `PSDispatcher`, `RoundRobin`, `HashName`: placement of parameter blocks on servers.
- `strategy_from_config`, `check_strategy`: what ``distributed_optimizer`` accepts.
"""
from strategies.collective import CollectiveStrategy, HybridStrategy
from strategies.dispatcher import HashName, PSDispatcher, RoundRobin
from strategies.distributed_strategy import (
    AsyncStrategy,
    DistributedStrategy,
    DistributedStrategyFactory,
    GeoStrategy,
    HalfAsyncStrategy,
    StrategyFactory,
    SyncStrategy,
    check_strategy,
    strategy_from_config,
)
from strategies.execution import BuildStrategy, ExecutionStrategy, ReduceStrategy
from strategies.runtime_config import MODES, ServerRuntimeConfig, TrainerRuntimeConfig
from strategies.transpiler_config import MIN_BLOCK_SIZE, DistributeTranspilerConfig

__all__ = [
    "AsyncStrategy",
    "BuildStrategy",
    "CollectiveStrategy",
    "DistributeTranspilerConfig",
    "DistributedStrategy",
    "DistributedStrategyFactory",
    "ExecutionStrategy",
    "GeoStrategy",
    "HalfAsyncStrategy",
    "HashName",
    "HybridStrategy",
    "MIN_BLOCK_SIZE",
    "MODES",
    "PSDispatcher",
    "ReduceStrategy",
    "RoundRobin",
    "ServerRuntimeConfig",
    "StrategyFactory",
    "SyncStrategy",
    "TrainerRuntimeConfig",
    "check_strategy",
    "strategy_from_config",
]
