"""Strategies and configs: fleet's own behaviour (validation, messages, environment).

Paddle-compatibility acceptance tests are in test_paddle_compat_roles_strategies.py.
"""
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fleet.errors import ConfigError
from strategies import (
    AsyncStrategy,
    CollectiveStrategy,
    DistributedStrategyFactory,
    BuildStrategy,
    DistributedStrategy,
    DistributeTranspilerConfig,
    ExecutionStrategy,
    GeoStrategy,
    HalfAsyncStrategy,
    HashName,
    PSDispatcher,
    RoundRobin,
    ServerRuntimeConfig,
    StrategyFactory,
    SyncStrategy,
    TrainerRuntimeConfig,
    strategy_from_config,
)

EPS = ["127.0.0.1:6170", "127.0.0.1:6171", "127.0.0.1:6172"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name == "CPU_NUM" or name.startswith("FLAGS_"):
            monkeypatch.delenv(name)


def config_error(action):
    with pytest.raises(ConfigError) as info:
        action()
    return str(info.value)


# --- DistributeTranspilerConfig fields ----------------------------------------------------

@pytest.mark.parametrize("value", ["abc", 8191, 0, True, 8192.0, None])
def test_min_block_size_must_be_an_int_of_at_least_8192(value):
    config = DistributeTranspilerConfig()
    message = config_error(lambda: setattr(config, "min_block_size", value))
    assert message == (
        f"DistributeTranspilerConfig.min_block_size={value!r} is invalid: expected an int >= 8192; "
        "set it to at least 8192 elements, e.g. 81920"
    )
    assert config.min_block_size == 8192


def test_min_block_size_accepts_numpy_ints_as_python_ints():
    config = DistributeTranspilerConfig()
    config.min_block_size = np.int64(81920)
    assert config.min_block_size == 81920 and type(config.min_block_size) is int


@pytest.mark.parametrize("value", [0, -5, "100"])
def test_geo_push_interval_must_be_positive(value):
    config = DistributeTranspilerConfig()
    message = config_error(lambda: setattr(config, "geo_sgd_need_push_nums", value))
    assert message.startswith(f"DistributeTranspilerConfig.geo_sgd_need_push_nums={value!r} is invalid: expected an int >= 1")


@pytest.mark.parametrize("value", ["yes", 2, None, [True]])
def test_bool_fields_reject_non_bools(value):
    config = DistributeTranspilerConfig()
    message = config_error(lambda: setattr(config, "slice_var_up", value))
    assert message == (
        f"DistributeTranspilerConfig.slice_var_up={value!r} is invalid: expected True or False; "
        "set slice_var_up = True or False"
    )


def test_bool_fields_accept_zero_one_and_numpy_bools():
    config = DistributeTranspilerConfig()
    config.slice_var_up = 0
    config.print_log = np.bool_(True)
    assert config.slice_var_up is False and config.print_log is True


@pytest.mark.parametrize("mode", ["nccl2", "collective"])
def test_nccl2_and_collective_modes_make_a_collective_strategy(mode):
    config = DistributeTranspilerConfig()
    config.mode = mode
    strategy = strategy_from_config(config)
    assert isinstance(strategy, CollectiveStrategy) and strategy.mode == "collective"
    assert strategy.get_program_config() is config
    assert config_error(lambda: setattr(config, "mode", "ring")).startswith(
        "DistributeTranspilerConfig.mode='ring' is invalid: expected one of 'pserver', 'nccl2', 'collective'")


def test_collective_strategy_has_paddles_fields_and_refuses_what_it_cannot_do():
    strategy = DistributedStrategyFactory.create_collective_strategy()
    assert strategy.mode == "collective" and strategy.nccl_comm_num == 1 and strategy.collective_mode is None
    strategy.nccl_comm_num = 2  # GPU-only: accepted, validated, no effect
    strategy.use_hierarchical_allreduce = True
    strategy.mode = "collective"
    assert strategy.collective_fields()["nccl_comm_num"] == 2
    assert strategy.exec_strategy is strategy.get_execute_strategy()
    assert config_error(lambda: setattr(strategy, "nccl_comm_num", 0)).startswith(
        "CollectiveStrategy.nccl_comm_num=0 is invalid: expected an int >= 1")
    assert config_error(lambda: setattr(strategy, "use_local_sgd", True)).startswith(
        "CollectiveStrategy.use_local_sgd=True is invalid: expected False; fleet all-reduces gradients every step")
    assert config_error(lambda: setattr(strategy, "collective_mode", "local_sgd")).startswith(
        "CollectiveStrategy.collective_mode='local_sgd' is invalid: expected one of None, 'grad_allreduce'")
    assert config_error(lambda: setattr(strategy, "nccl_comm", 1)).startswith(
        "CollectiveStrategy doesn't have key: nccl_comm; valid keys: mode, collective_mode")


def test_hybrid_strategy_uses_async_flags_and_a_thread_barrier():
    strategy = DistributedStrategyFactory.create_hybrid_strategy()
    assert strategy.mode == "hybrid"
    assert "communicator_is_sgd_optimizer" in strategy.get_trainer_runtime_config().get_communicator_flags()
    assert strategy.get_execute_strategy().use_thread_barrier
    assert not strategy.get_program_config().sync_mode


def test_assigning_an_unknown_name_is_refused_with_the_valid_keys():
    config = DistributeTranspilerConfig()
    message = config_error(lambda: setattr(config, "min_blok_size", 81920))
    assert message.startswith("DistributeTranspilerConfig doesn't have key: min_blok_size; valid keys: slice_var_up, ")
    assert "min_block_size" in message


def test_split_method_names_resolve_to_dispatchers():
    config = DistributeTranspilerConfig()
    assert config.split_method is None and config.dispatcher_class() is RoundRobin
    config.split_method = "HashName"
    assert config.dispatcher_class() is HashName
    config.split_method = "RoundRobin"
    assert config.dispatcher_class() is RoundRobin
    config.split_method = HashName
    dispatcher = config.make_dispatcher(EPS)
    assert isinstance(dispatcher, HashName) and dispatcher.eps == EPS


def test_split_method_accepts_a_user_dispatcher_subclass():
    class Everything0(PSDispatcher):
        def dispatch(self, varlist):
            return [self._eps[0] for _ in varlist]

    config = DistributeTranspilerConfig()
    config.split_method = Everything0
    assert config.make_dispatcher(EPS).dispatch(["a", "b"]) == [EPS[0], EPS[0]]


@pytest.mark.parametrize("value", ["Random", PSDispatcher, int, 3, ["HashName"]])
def test_split_method_rejects_other_values(value):
    config = DistributeTranspilerConfig()
    assert config_error(lambda: setattr(config, "split_method", value)).startswith(
        f"DistributeTranspilerConfig.split_method={value!r} is invalid: expected None (RoundRobin), "
        "'RoundRobin', 'HashName', or a subclass of strategies.PSDispatcher"
    )


def test_split_method_instance_is_refused_with_a_hint():
    config = DistributeTranspilerConfig()
    assert "(pass the class, not an instance)" in config_error(
        lambda: setattr(config, "split_method", RoundRobin(EPS))
    )


def test_configs_compare_by_value():
    a, b = DistributeTranspilerConfig(), DistributeTranspilerConfig()
    assert a == b
    b.min_block_size = 81920
    assert a != b
    assert b.to_dict()["min_block_size"] == 81920


# --- dict updates are all or nothing --------------------------------------------------------

def test_program_config_dict_with_an_unknown_key_changes_nothing():
    strategy = AsyncStrategy()
    with pytest.raises(ConfigError, match="^DistributeTranspilerConfig doesn't have key: foo; valid keys: "):
        strategy.set_program_config({"min_block_size": 81920, "foo": 1})
    assert strategy.get_program_config().min_block_size == 8192


def test_program_config_dict_with_a_bad_value_changes_nothing():
    strategy = AsyncStrategy()
    with pytest.raises(ConfigError):
        strategy.set_program_config({"min_block_size": 81920, "slice_var_up": "no"})
    assert strategy.get_program_config().min_block_size == 8192


def test_program_config_dict_updates_the_live_object():
    strategy = AsyncStrategy()
    config = strategy.get_program_config()
    strategy.set_program_config({"min_block_size": 81920, "split_method": "HashName"})
    assert config.min_block_size == 81920 and config.split_method == "HashName"


def test_non_string_dict_keys_are_refused():
    with pytest.raises(ConfigError, match="^ExecutionStrategy doesn't have key: 1; "):
        AsyncStrategy().set_execute_strategy({1: 2})


def test_trainer_runtime_dict_with_a_bad_value_changes_nothing():
    strategy = AsyncStrategy()
    with pytest.raises(ConfigError):
        strategy.set_trainer_runtime_config(
            {"communicator_send_queue_size": 20, "communicator_thread_pool_size": 0}
        )
    assert strategy.get_trainer_runtime_config().runtime_configs["communicator_send_queue_size"] == 1


# --- environment ------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_cpu_num_must_be_a_positive_int(monkeypatch, value):
    monkeypatch.setenv("CPU_NUM", value)
    expected = (
        f"CPU_NUM={value!r} is not an integer >= 1; set CPU_NUM to the number of training "
        "threads per worker (e.g. CPU_NUM=4), or unset it to use the default 1"
    )
    assert config_error(ExecutionStrategy) == expected
    assert config_error(StrategyFactory.create_async_strategy) == expected


def test_blank_cpu_num_means_unset(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "  ")
    assert ExecutionStrategy().num_threads == 1


def test_bad_communicator_flag_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLAGS_communicator_send_queue_size", "lots")
    assert config_error(SyncStrategy).startswith(
        "FLAGS_communicator_send_queue_size='lots' is not an integer >= 1; set "
        "FLAGS_communicator_send_queue_size to an int >= 1"
    )


def test_zero_one_flag_from_the_environment_must_be_zero_or_one(monkeypatch):
    monkeypatch.setenv("FLAGS_communicator_independent_recv_thread", "2")
    assert config_error(AsyncStrategy).startswith(
        "FLAGS_communicator_independent_recv_thread=2 is not 0 or 1"
    )


def test_flags_of_other_modes_are_not_read(monkeypatch):
    monkeypatch.setenv("FLAGS_communicator_independent_recv_thread", "bad")
    assert "communicator_independent_recv_thread" not in SyncStrategy().get_trainer_runtime_config().runtime_configs


def test_rpc_flags_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLAGS_rpc_deadline", "5000")
    monkeypatch.setenv("FLAGS_rpc_retry_times", "0")
    flags = TrainerRuntimeConfig().get_communicator_flags()
    assert flags == {"rpc_deadline": 5000, "rpc_retry_times": 0}


def test_server_thread_counts_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLAGS_rpc_get_thread_num", "3")
    config = ServerRuntimeConfig()
    assert (config.rpc_send_thread_num, config.rpc_get_thread_num, config._rpc_get_thread_num) == (12, 3, 3)
    monkeypatch.setenv("FLAGS_rpc_send_thread_num", "0")
    assert config_error(ServerRuntimeConfig).startswith("FLAGS_rpc_send_thread_num='0' is not an integer >= 1")


def test_server_config_paddle_names_are_validated_aliases():
    config = ServerRuntimeConfig()
    config._rpc_prefetch_thread_num = 4
    assert config.rpc_prefetch_thread_num == 4
    assert config_error(lambda: setattr(config, "_rpc_send_thread_num", 0)).startswith(
        "ServerRuntimeConfig.rpc_send_thread_num=0 is invalid: expected an int >= 1"
    )
    strategy = AsyncStrategy()
    strategy.set_server_runtime_config({"_rpc_get_thread_num": 5, "rpc_send_thread_num": 6})
    assert strategy.get_server_runtime_config().to_dict() == {
        "rpc_send_thread_num": 6, "rpc_get_thread_num": 5, "rpc_prefetch_thread_num": 12,
    }


# --- TrainerRuntimeConfig -------------------------------------------------------------------

def test_runtime_flags_are_validated_on_assignment():
    flags = AsyncStrategy().get_trainer_runtime_config().runtime_configs
    flags["communicator_send_queue_size"] = "20"  # Paddle stored env strings
    assert flags["communicator_send_queue_size"] == 20
    flags["communicator_is_sgd_optimizer"] = False
    assert flags["communicator_is_sgd_optimizer"] == 0
    message = config_error(lambda: flags.__setitem__("communicator_send_queue_size", 0))
    assert message == (
        "TrainerRuntimeConfig.runtime_configs['communicator_send_queue_size']=0 is invalid: "
        "expected an int >= 1; set it (or FLAGS_communicator_send_queue_size) to such a value"
    )
    assert config_error(lambda: flags.__setitem__("communicator_is_sgd_optimizer", 2)).endswith(
        "expected 0 or 1; set it (or FLAGS_communicator_is_sgd_optimizer) to such a value"
    )
    assert config_error(lambda: flags.__setitem__("communicator_thread_pool_size", "many"))
    assert config_error(lambda: flags.__setitem__("communicator_thread_pool_size", True))


def test_runtime_flags_have_fixed_keys():
    flags = GeoStrategy().get_trainer_runtime_config().runtime_configs
    assert config_error(lambda: flags.__setitem__("communicator_send_queue_size", 4)).startswith(
        "TrainerRuntimeConfig doesn't have key: communicator_send_queue_size; valid keys: rpc_deadline, "
    )
    assert config_error(lambda: flags.__delitem__("rpc_deadline")).startswith(
        "TrainerRuntimeConfig keys cannot be removed ('rpc_deadline')"
    )


def test_communicator_flags_are_a_copy():
    config = AsyncStrategy().get_trainer_runtime_config()
    config.get_communicator_flags()["communicator_send_queue_size"] = 99
    assert config.runtime_configs["communicator_send_queue_size"] == 1


def test_trainer_runtime_config_repr_is_a_table(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "4")
    text = repr(HalfAsyncStrategy().get_trainer_runtime_config())
    lines = text.splitlines()
    assert lines[1].startswith("TrainerRuntimeConfig Overview (mode: half_async)") and lines[1].endswith("Value")
    assert set(lines[0]) == {"="} and set(lines[2]) == {"-"} and set(lines[-1]) == {"="}
    rows = {line.split()[0]: line.split()[1] for line in lines[3:-1]}
    assert rows == {
        "rpc_deadline": "180000", "rpc_retry_times": "3", "communicator_max_merge_var_num": "4",
        "communicator_send_queue_size": "4", "communicator_send_wait_times": "5",
        "communicator_thread_pool_size": "10",
    }


def test_unknown_trainer_runtime_mode_is_refused():
    assert config_error(lambda: TrainerRuntimeConfig("hogwild")).startswith(
        "TrainerRuntimeConfig mode='hogwild' is invalid"
    )


def test_trainer_runtime_config_object_must_match_the_strategy_mode():
    strategy = SyncStrategy()
    message = config_error(lambda: strategy.set_trainer_runtime_config(TrainerRuntimeConfig("async")))
    assert message == (
        "this TrainerRuntimeConfig is for mode 'async' but SyncStrategy runs mode 'sync'; "
        "pass TrainerRuntimeConfig(mode='sync') or a dict"
    )
    replacement = TrainerRuntimeConfig("sync")
    strategy.set_trainer_runtime_config(replacement)
    assert strategy.get_trainer_runtime_config() is replacement


# --- execution, build, debug ----------------------------------------------------------------

def test_execution_strategy_defaults(monkeypatch):
    assert ExecutionStrategy().to_dict() == {
        "num_threads": 1, "use_thread_barrier": False,
        "num_iteration_per_drop_scope": 100, "num_iteration_per_run": 1,
    }
    monkeypatch.setenv("CPU_NUM", "3")
    assert ExecutionStrategy().num_threads == 3


def test_execution_threads_must_be_positive():
    strategy = ExecutionStrategy()
    assert config_error(lambda: setattr(strategy, "num_threads", 0)) == (
        "ExecutionStrategy.num_threads=0 is invalid: expected an int >= 1; "
        "set it to the number of training threads, e.g. 4"
    )


def test_reduce_strategy_accepts_the_enum_or_paddle_ints():
    build = BuildStrategy()
    assert build.reduce_strategy is BuildStrategy.ReduceStrategy.AllReduce
    build.reduce_strategy = 1
    assert build.reduce_strategy is BuildStrategy.ReduceStrategy.Reduce
    assert config_error(lambda: setattr(build, "reduce_strategy", "Reduce")) == (
        "BuildStrategy.reduce_strategy='Reduce' is invalid: expected "
        "BuildStrategy.ReduceStrategy.AllReduce or .Reduce; "
        "e.g. build_strategy.reduce_strategy = BuildStrategy.ReduceStrategy.Reduce"
    )


def test_debug_opt_is_validated():
    strategy = AsyncStrategy()
    assert config_error(lambda: strategy.set_debug_opt({"dump_everything": 1})).startswith(
        "debug_opt doesn't have key: dump_everything; valid keys: dump_slot, dump_converter"
    )
    assert config_error(lambda: strategy.set_debug_opt({"dump_file_num": 0})) == (
        "debug_opt['dump_file_num']=0 is invalid: expected an int >= 1"
    )
    assert config_error(lambda: strategy.set_debug_opt({"dump_fields": "a,b"}))
    with pytest.raises(TypeError, match=r"^debug_opt only accept input type: dict \(got list\)$"):
        strategy.set_debug_opt([])


def test_debug_opt_none_clears_it():
    strategy = AsyncStrategy()
    strategy.set_debug_opt({"dump_slot": True})
    strategy.set_debug_opt(None)
    assert strategy.get_debug_opt() == {}


# --- strategies -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "cls, mode",
    [(SyncStrategy, "sync"), (AsyncStrategy, "async"), (HalfAsyncStrategy, "half_async"), (GeoStrategy, "geo")],
)
def test_each_strategy_names_its_mode_read_only(cls, mode):
    strategy = cls()
    assert strategy.mode == mode
    assert strategy.get_trainer_runtime_config().mode == mode
    with pytest.raises(AttributeError):
        strategy.mode = "async"


def test_base_strategy_names_no_mode_and_has_only_rpc_flags():
    strategy = DistributedStrategy()
    assert strategy.mode is None
    assert strategy.get_trainer_runtime_config().get_communicator_flags() == {
        "rpc_deadline": 180000, "rpc_retry_times": 3,
    }
    assert strategy.get_program_config() == DistributeTranspilerConfig()


@pytest.mark.parametrize("frequency", [0, -1, 1.5, True, "100"])
def test_geo_update_frequency_must_be_a_positive_int(frequency):
    message = config_error(lambda: GeoStrategy(update_frequency=frequency))
    assert message == (
        f"GeoStrategy update_frequency={frequency!r} is invalid: expected an int >= 1 "
        "(steps between GEO pushes); e.g. GeoStrategy(update_frequency=100)"
    )
    assert config_error(lambda: StrategyFactory.create_geo_strategy(frequency)) == message


def test_geo_update_frequency_reads_the_program_config():
    strategy = GeoStrategy(400)
    assert strategy.update_frequency == 400
    strategy.get_program_config().geo_sgd_need_push_nums = 50
    assert strategy.update_frequency == 50


def test_strategies_do_not_share_configs():
    a, b = AsyncStrategy(), AsyncStrategy()
    a.get_program_config().min_block_size = 81920
    a.get_trainer_runtime_config().runtime_configs["communicator_send_queue_size"] = 8
    assert b.get_program_config().min_block_size == 8192
    assert b.get_trainer_runtime_config().runtime_configs["communicator_send_queue_size"] == 1


def test_strategy_repr_shows_mode_and_flags():
    text = repr(GeoStrategy(7))
    assert text.startswith("GeoStrategy(mode='geo', program_config=DistributeTranspilerConfig(")
    assert "geo_sgd_need_push_nums=7" in text and "communicator_flags={" in text


# --- dispatchers ------------------------------------------------------------------------------

def test_hash_name_is_crc32_of_the_name_not_the_salted_hash():
    names = [f"fc_{i}.w_0.block{j}" for i in range(5) for j in range(3)]
    expected = [EPS[zlib.crc32(n.encode()) % 3] for n in names]
    assert HashName(EPS).dispatch(names) == expected
    # Fixed values: the same on every run and every process, whatever PYTHONHASHSEED is.
    assert zlib.crc32(b"SparseFeatFactors") == 1795948552
    assert HashName(EPS).dispatch(["SparseFeatFactors"]) == [EPS[1]]


def test_hash_name_accepts_variables_with_a_name_attribute_or_method():
    class Attr:
        name = "SparseFeatFactors"

    class Method:
        def name(self):
            return "SparseFeatFactors"

    assert HashName(EPS).dispatch([Attr(), Method()]) == [EPS[1], EPS[1]]
    with pytest.raises(TypeError, match="^cannot dispatch 3: pass variable names"):
        HashName(EPS).dispatch([3])


def test_hash_name_ignores_the_cursor_and_reset():
    dispatcher = HashName(EPS)
    first = dispatcher.dispatch(["a", "b", "c"])
    dispatcher.reset()
    assert dispatcher.dispatch(["a", "b", "c"]) == first


@pytest.mark.parametrize("endpoints", [[], "127.0.0.1:6170", [6170], None])
def test_dispatcher_needs_a_list_of_endpoint_strings(endpoints):
    with pytest.raises(TypeError, match="^pserver_endpoints must be a non-empty list"):
        RoundRobin(endpoints)


def test_base_dispatcher_dispatch_is_abstract():
    with pytest.raises(NotImplementedError, match="^Interface has not been implemented.$"):
        PSDispatcher(EPS).dispatch(["a"])


# --- properties ------------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(server_num=st.integers(1, 6), var_num=st.integers(0, 40))
def test_round_robin_balances_servers_within_one_variable(server_num, var_num):
    endpoints = [f"127.0.0.1:{6170 + i}" for i in range(server_num)]
    placed = RoundRobin(endpoints).dispatch([f"v{i}" for i in range(var_num)])
    counts = [placed.count(ep) for ep in endpoints]
    assert sum(counts) == var_num and max(counts) - min(counts) <= 1
    assert placed == [endpoints[i % server_num] for i in range(var_num)]


@settings(max_examples=50, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=20), max_size=20), server_num=st.integers(1, 6))
def test_hash_name_depends_only_on_the_name(names, server_num):
    endpoints = [f"127.0.0.1:{6170 + i}" for i in range(server_num)]
    placed = HashName(endpoints).dispatch(names)
    assert placed == [HashName(endpoints).dispatch([n])[0] for n in names]
    assert placed == [endpoints[zlib.crc32(n.encode("utf-8")) % server_num] for n in names]
