"""Paddle Fleet 1.7 compatibility of role makers and strategies (reference sections 2, 3, 5.2, 9).

Written from the reference's checklist: names, defaults, flags and exact messages a script
written for Paddle relies on. Paddle's messages may be followed by fleet's details (the
value seen), so messages are matched from their start.
"""
import os
import re

import pytest

from role_makers import PaddleCloudRoleMaker, Role, UserDefinedCollectiveRoleMaker, UserDefinedRoleMaker
from role_makers import paddle_cloud_role_maker
from strategies import (
    AsyncStrategy,
    BuildStrategy,
    DistributedStrategyFactory,
    DistributeTranspilerConfig,
    ExecutionStrategy,
    GeoStrategy,
    HalfAsyncStrategy,
    HashName,
    RoundRobin,
    ServerRuntimeConfig,
    StrategyFactory,
    SyncStrategy,
    TrainerRuntimeConfig,
    check_strategy,
    strategy_from_config,
)

SERVERS = ["127.0.0.1:6001", "127.0.0.1:6002"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name in ("CPU_NUM", "TRAINING_ROLE", "POD_IP") or name.startswith(("FLAGS_", "PADDLE_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(paddle_cloud_role_maker, "_local_notice_given", False)


def starts(message):
    return "^" + re.escape(message)


# --- 2. Role and UserDefinedRoleMaker ------------------------------------------------------------

def test_role_values_are_paddles():
    assert Role.WORKER == 1 and Role.SERVER == 2


def test_user_defined_role_maker_doc_example():
    role = UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=3, server_endpoints=SERVERS)
    role.generate_role()
    assert role.is_worker() and not role.is_server() and role.is_first_worker()
    assert (role.worker_num(), role.worker_index(), role.server_index(), role.role_id()) == (3, 0, 0, 0)
    assert role.get_pserver_endpoints() == SERVERS and role.server_num() == 2
    assert role.to_string() == (
        "role: 1, current_id: 0, worker_endpoints: [], "
        "server_endpoints: ['127.0.0.1:6001', '127.0.0.1:6002']"
    )


def test_user_defined_server_role():
    role = UserDefinedRoleMaker(current_id=1, role=Role.SERVER, worker_num=3, server_endpoints=SERVERS)
    assert role.is_server() and not role.is_first_worker()
    assert role.server_index() == 1 and role.role_id() == 1


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(server_endpoints=None), TypeError, "server_endpoints must be as string list"),
        (dict(server_endpoints="127.0.0.1:6001"), TypeError, "server_endpoints must be as string list"),
        (dict(server_endpoints=[]), ValueError, "the length of server_endpoints list must be greater than 0"),
        (dict(server_endpoints=SERVERS + SERVERS[:1]), ValueError, "server_endpoints can't have duplicate elements"),
        (dict(server_endpoints=["127.0.0.1:6001", 6002]), TypeError,
         "every element in server_endpoints list must be as string"),
        (dict(role=3), TypeError, "role must be as Role"),
        (dict(current_id="0"), TypeError, "current_id must be as int"),
        (dict(current_id=-1), ValueError, "current_id must be greater than or equal to 0"),
        (dict(current_id=2, role=Role.SERVER), ValueError,
         "if role is Role.SERVER, current_id must be less than or equal to len(server_endpoints) - 1"),
        (dict(worker_num="3"), TypeError, "worker_num must be as int"),
        (dict(worker_num=0), ValueError, "worker_num must be greater than 0"),
        (dict(worker_num=-3), ValueError, "worker_num must be greater than 0"),
    ],
)
def test_user_defined_role_maker_messages(kwargs, error, message):
    arguments = dict(current_id=0, role=Role.WORKER, worker_num=3, server_endpoints=SERVERS)
    arguments.update(kwargs)
    with pytest.raises(error, match=starts(message)):
        UserDefinedRoleMaker(**arguments)


def test_user_defined_role_maker_defaults_are_rejected_as_in_paddle():
    with pytest.raises(TypeError, match=starts("server_endpoints must be as string list")):
        UserDefinedRoleMaker()
    with pytest.raises(ValueError, match=starts("worker_num must be greater than 0")):
        UserDefinedRoleMaker(server_endpoints=SERVERS)


def test_user_defined_checks_run_in_paddles_order():
    # Bad role and bad worker_num: the role is reported first.
    with pytest.raises(TypeError, match=starts("role must be as Role")):
        UserDefinedRoleMaker(current_id=0, role=7, worker_num=0, server_endpoints=SERVERS)
    # Bad current_id and bad worker_num: current_id first.
    with pytest.raises(ValueError, match=starts("current_id must be greater than or equal to 0")):
        UserDefinedRoleMaker(current_id=-1, role=Role.WORKER, worker_num=0, server_endpoints=SERVERS)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(worker_endpoints=None), TypeError, "worker_endpoints must be as string list"),
        (dict(worker_endpoints=[]), ValueError, "the length of worker_endpoints list must be greater than 0"),
        (dict(worker_endpoints=SERVERS[:1] * 2), ValueError, "worker_endpoints can't have duplicate elements"),
        (dict(worker_endpoints=[b"127.0.0.1:6001"]), TypeError,
         "every element in worker_endpoints list must be as string"),
        (dict(current_id=1.0), TypeError, "current_id must be as int"),
        (dict(current_id=-1), ValueError, "current_id must be greater than or equal to 0"),
        (dict(current_id=2), ValueError, "current_id must be less than or equal to len(worker_endpoints) - 1"),
    ],
)
def test_user_defined_collective_role_maker_messages(kwargs, error, message):
    arguments = dict(current_id=0, worker_endpoints=SERVERS)
    arguments.update(kwargs)
    with pytest.raises(error, match=starts(message)):
        UserDefinedCollectiveRoleMaker(**arguments)


def test_user_defined_collective_role_maker_is_always_a_worker():
    role = UserDefinedCollectiveRoleMaker(current_id=1, worker_endpoints=SERVERS)
    assert role.is_worker() and role.worker_num() == 2 and role.worker_index() == 1


# --- 2.2 PaddleCloudRoleMaker ------------------------------------------------------------------

def cluster_env(monkeypatch, role, **extra):
    monkeypatch.setenv("TRAINING_ROLE", role)
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(SERVERS))
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def test_paddle_cloud_trainer(monkeypatch):
    cluster_env(monkeypatch, "TRAINER", PADDLE_TRAINER_ID="0")
    role = PaddleCloudRoleMaker()
    assert role.is_worker() and not role.is_server() and role.is_first_worker()
    assert (role.worker_num(), role.worker_index(), role.role_id()) == (2, 0, 0)
    assert role.get_pserver_endpoints() == SERVERS and role.server_num() == 2
    assert role.get_trainer_endpoints() == []  # G2 sets no worker endpoints without PADDLE_TRAINER_ENDPOINTS


def test_paddle_cloud_pserver(monkeypatch):
    cluster_env(monkeypatch, "PSERVER", POD_IP="127.0.0.1", PADDLE_PORT="6002")
    role = PaddleCloudRoleMaker()
    assert role.is_server() and not role.is_worker() and not role.is_first_worker()
    assert role.server_index() == 1 and role.role_id() == 1 and role.worker_num() == 2
    assert role.get_pserver_endpoints()[role.server_index()] == "127.0.0.1:6002"


def test_paddle_cloud_two_servers_two_workers_split_roles(monkeypatch):
    roles = []
    for role_name, extra in [
        ("PSERVER", dict(POD_IP="127.0.0.1", PADDLE_PORT="6001")),
        ("PSERVER", dict(POD_IP="127.0.0.1", PADDLE_PORT="6002")),
        ("TRAINER", dict(PADDLE_TRAINER_ID="0")),
        ("TRAINER", dict(PADDLE_TRAINER_ID="1")),
    ]:
        with monkeypatch.context() as env:
            cluster_env(env, role_name, **extra)
            role = PaddleCloudRoleMaker()
            role.generate_role()
            roles.append(role)
    servers, workers = roles[:2], roles[2:]
    assert [r.is_server() for r in roles] == [True, True, False, False]
    assert [r.server_index() for r in servers] == [0, 1]
    assert [r.worker_index() for r in workers] == [0, 1]
    assert [r.is_first_worker() for r in roles] == [False, False, True, False]
    assert all(r.get_pserver_endpoints() == SERVERS and r.worker_num() == 2 for r in roles)


def test_paddle_cloud_bad_training_role_keeps_paddles_message(monkeypatch):
    cluster_env(monkeypatch, "WORKER", PADDLE_TRAINER_ID="0")
    with pytest.raises(ValueError, match="TRAINING_ROLE must be PSERVER or TRAINER"):
        PaddleCloudRoleMaker().generate_role()


@pytest.mark.parametrize("missing", ["PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID"])
def test_paddle_cloud_missing_variable_is_a_value_error_naming_it_not_a_key_error(monkeypatch, missing):
    cluster_env(monkeypatch, "TRAINER", PADDLE_TRAINER_ID="0")
    monkeypatch.delenv(missing)
    with pytest.raises(ValueError, match=starts(f"{missing} is not set")):
        PaddleCloudRoleMaker().generate_role()


def test_paddle_cloud_pserver_endpoint_not_in_list_is_a_value_error(monkeypatch):
    cluster_env(monkeypatch, "PSERVER", POD_IP="10.0.0.9", PADDLE_PORT="6001")
    with pytest.raises(ValueError, match="is not in PADDLE_PSERVERS_IP_PORT_LIST"):
        PaddleCloudRoleMaker().generate_role()


def test_paddle_cloud_without_training_role_is_one_local_worker():
    role = PaddleCloudRoleMaker()
    assert role.is_worker() and role.is_first_worker() and role.is_local()
    assert (role.worker_num(), role.worker_index(), role.server_num()) == (1, 0, 0)


def test_paddle_cloud_generates_role_lazily_in_every_getter(monkeypatch):
    cluster_env(monkeypatch, "TRAINER", PADDLE_TRAINER_ID="1")
    for getter in ("is_worker", "is_server", "is_first_worker", "worker_num", "worker_index",
                   "server_index", "server_num", "role_id", "get_trainer_endpoints",
                   "get_pserver_endpoints", "to_string"):
        role = PaddleCloudRoleMaker()
        getattr(role, getter)()
        assert role._role_is_generated, getter


# --- 3.1 DistributeTranspilerConfig --------------------------------------------------------------

def test_distribute_transpiler_config_defaults():
    config = DistributeTranspilerConfig()
    assert config.to_dict() == {
        "slice_var_up": True, "split_method": None, "min_block_size": 8192,
        "enable_dc_asgd": False, "merge_async_pushes": 1, "mode": "pserver", "print_log": False,
        "wait_port": True,
        "runtime_split_send_recv": False, "sync_mode": True, "half_async": False,
        "completely_not_async": False, "geo_sgd_mode": False, "geo_sgd_need_push_nums": 100,
        "nccl_comm_num": 1, "use_hierarchical_allreduce": False,
        "hierarchical_allreduce_inter_nranks": 0, "collective_mode": None,
    }


def test_runtime_split_cannot_be_set_while_sync_mode_is_true():
    config = DistributeTranspilerConfig()
    with pytest.raises(ValueError, match=starts(
        "if you want to set runtime_split_send_recv to be true, make ensure config.sync_mode is false at first"
    )):
        config.runtime_split_send_recv = True
    config.sync_mode = False
    config.runtime_split_send_recv = True
    assert config.runtime_split_send_recv is True


def test_sync_mode_cannot_be_set_while_runtime_split_is_true():
    config = DistributeTranspilerConfig()
    config.sync_mode = False
    config.runtime_split_send_recv = True
    with pytest.raises(ValueError, match=starts(
        "if you want to set sync_mode to be true, make ensure config.runtime_split_send_recv is false at first"
    )):
        config.sync_mode = True


def test_sync_mode_and_runtime_split_cannot_be_none():
    config = DistributeTranspilerConfig()
    with pytest.raises(ValueError, match=starts("sync_mode can't be None")):
        config.sync_mode = None
    with pytest.raises(ValueError, match=starts("runtime_split_send_recv can't be None")):
        config.runtime_split_send_recv = None


def test_min_block_size_below_8192_is_a_value_error():
    config = DistributeTranspilerConfig()
    with pytest.raises(ValueError, match="min_block_size=8191"):
        config.min_block_size = 8191
    config.min_block_size = 81920
    assert config.min_block_size == 81920


# --- 3.2 ServerRuntimeConfig --------------------------------------------------------------------

def test_server_runtime_config_defaults_and_paddle_names():
    config = ServerRuntimeConfig()
    assert (config._rpc_send_thread_num, config._rpc_get_thread_num, config._rpc_prefetch_thread_num) == (12, 12, 12)


# --- 3.3 DistributedStrategy base ---------------------------------------------------------------

@pytest.mark.parametrize("cpu_num, reduce", [(None, BuildStrategy.ReduceStrategy.AllReduce),
                                              ("1", BuildStrategy.ReduceStrategy.AllReduce),
                                              ("4", BuildStrategy.ReduceStrategy.Reduce)])
def test_strategy_threads_and_reduce_follow_cpu_num(monkeypatch, cpu_num, reduce):
    if cpu_num is not None:
        monkeypatch.setenv("CPU_NUM", cpu_num)
    strategy = AsyncStrategy()
    assert strategy.get_execute_strategy().num_threads == int(cpu_num or 1)
    assert strategy.get_build_strategy().reduce_strategy == reduce
    assert BuildStrategy().reduce_strategy == BuildStrategy.ReduceStrategy.AllReduce


def test_reduce_strategy_values_are_paddles():
    assert BuildStrategy.ReduceStrategy.AllReduce == 0 and BuildStrategy.ReduceStrategy.Reduce == 1


def test_set_program_config_with_a_dict():
    strategy = AsyncStrategy()
    strategy.set_program_config({"min_block_size": 81920, "slice_var_up": False})
    config = strategy.get_program_config()
    assert config.min_block_size == 81920 and config.slice_var_up is False
    assert config.runtime_split_send_recv is True  # the strategy's flags are kept


def test_set_program_config_with_an_object_replaces_it():
    strategy = AsyncStrategy()
    config = DistributeTranspilerConfig()
    config.min_block_size = 16384
    strategy.set_program_config(config)
    assert strategy.get_program_config() is config


@pytest.mark.parametrize(
    "setter, valid, class_name",
    [
        ("set_program_config", DistributeTranspilerConfig, "DistributeTranspilerConfig"),
        ("set_trainer_runtime_config", lambda: TrainerRuntimeConfig("async"), "TrainerRuntimeConfig"),
        ("set_server_runtime_config", ServerRuntimeConfig, "ServerRuntimeConfig"),
        ("set_execute_strategy", ExecutionStrategy, "ExecutionStrategy"),
        ("set_build_strategy", BuildStrategy, "BuildStrategy"),
    ],
)
def test_every_setter_takes_an_object_or_a_dict_and_names_unknown_keys(setter, valid, class_name):
    strategy = AsyncStrategy()
    getattr(strategy, setter)(valid())
    with pytest.raises(ValueError, match=starts(f"{class_name} doesn't have key: no_such_key")):
        getattr(strategy, setter)({"no_such_key": 1})


@pytest.mark.parametrize(
    "setter, message",
    [
        ("set_program_config", "program_config only accept input type: dict or DistributeTranspilerConfig"),
        ("set_trainer_runtime_config", "trainer_runtime_config only accept input type: dict or TrainerRuntimeConfig"),
        ("set_server_runtime_config", "server_runtime_config only accept input type: dict or ServerRuntimeConfig"),
        ("set_execute_strategy", "execute_strategy only accept input type: dict or ExecutionStrategy"),
        ("set_build_strategy", "build_strategy only accept input type: dict or BuildStrategy"),
    ],
)
def test_every_setter_rejects_other_types_with_paddles_type_error(setter, message):
    with pytest.raises(TypeError, match=starts(message)):
        getattr(AsyncStrategy(), setter)(["min_block_size", 81920])


def test_debug_opt_defaults():
    strategy = AsyncStrategy()
    assert strategy.get_debug_opt() == {}
    strategy.set_debug_opt({"dump_slot": 1, "dump_fields": ["click"]})
    assert strategy.get_debug_opt() == {
        "dump_slot": True, "dump_converter": "", "dump_fields": ["click"], "dump_file_num": 16,
        "dump_fields_path": "", "dump_param": [],
    }


# --- 3.4 per-strategy flags ---------------------------------------------------------------------

def flags_of(strategy):
    config = strategy.get_program_config()
    return {
        "sync_mode": config.sync_mode, "runtime_split_send_recv": config.runtime_split_send_recv,
        "half_async": config.half_async, "completely_not_async": config.completely_not_async,
        "geo_sgd_mode": config.geo_sgd_mode,
        "async_mode": strategy.get_build_strategy().async_mode,
        "use_thread_barrier": strategy.get_execute_strategy().use_thread_barrier,
    }


def test_sync_strategy_flags():
    assert flags_of(SyncStrategy()) == {
        "sync_mode": False, "runtime_split_send_recv": True, "half_async": True,
        "completely_not_async": True, "geo_sgd_mode": False, "async_mode": True, "use_thread_barrier": True,
    }


def test_async_strategy_flags():
    assert flags_of(AsyncStrategy()) == {
        "sync_mode": False, "runtime_split_send_recv": True, "half_async": False,
        "completely_not_async": False, "geo_sgd_mode": False, "async_mode": True, "use_thread_barrier": False,
    }


def test_half_async_strategy_flags():
    assert flags_of(HalfAsyncStrategy()) == {
        "sync_mode": False, "runtime_split_send_recv": True, "half_async": True,
        "completely_not_async": False, "geo_sgd_mode": False, "async_mode": True, "use_thread_barrier": True,
    }


def test_geo_strategy_flags_and_update_frequency():
    strategy = GeoStrategy(update_frequency=400)
    assert flags_of(strategy) == {
        "sync_mode": False, "runtime_split_send_recv": True, "half_async": False,
        "completely_not_async": False, "geo_sgd_mode": True, "async_mode": True, "use_thread_barrier": False,
    }
    assert strategy.get_program_config().geo_sgd_need_push_nums == 400
    assert GeoStrategy().get_program_config().geo_sgd_need_push_nums == 100


RPC = {"rpc_deadline": 180000, "rpc_retry_times": 3}
QUEUES_CPU4 = {
    "communicator_max_merge_var_num": 4, "communicator_send_queue_size": 4,
    "communicator_send_wait_times": 5, "communicator_thread_pool_size": 10,
}


@pytest.mark.parametrize(
    "create, flags",
    [
        (StrategyFactory.create_sync_strategy, {**RPC, **QUEUES_CPU4}),
        (StrategyFactory.create_half_async_strategy, {**RPC, **QUEUES_CPU4}),
        (StrategyFactory.create_async_strategy, {
            **RPC, **QUEUES_CPU4, "communicator_independent_recv_thread": 0,
            "communicator_min_send_grad_num_before_recv": 4, "communicator_is_sgd_optimizer": 1,
        }),
        (StrategyFactory.create_geo_strategy, {
            **RPC, "communicator_send_wait_times": 5, "communicator_thread_pool_size": 10,
        }),
    ],
)
def test_trainer_runtime_keys_per_mode_with_cpu_num_4(monkeypatch, create, flags):
    monkeypatch.setenv("CPU_NUM", "4")
    assert create().get_trainer_runtime_config().get_communicator_flags() == flags


def test_flags_communicator_send_queue_size_overrides_the_default(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "4")
    monkeypatch.setenv("FLAGS_communicator_send_queue_size", "20")
    flags = AsyncStrategy().get_trainer_runtime_config().get_communicator_flags()
    assert flags["communicator_send_queue_size"] == 20
    assert flags["communicator_max_merge_var_num"] == 4


def test_set_trainer_runtime_config_with_a_dict():
    strategy = AsyncStrategy()
    strategy.set_trainer_runtime_config({"communicator_send_queue_size": 16})
    assert strategy.get_trainer_runtime_config().get_communicator_flags()["communicator_send_queue_size"] == 16


def test_plain_trainer_runtime_config_has_only_rpc_keys():
    assert TrainerRuntimeConfig().get_communicator_flags() == RPC


# --- 3.5 factory ----------------------------------------------------------------------------------

def test_strategy_factory_is_an_alias_with_static_methods():
    assert StrategyFactory is DistributedStrategyFactory
    assert type(DistributedStrategyFactory.create_sync_strategy()) is SyncStrategy
    assert type(DistributedStrategyFactory.create_async_strategy()) is AsyncStrategy
    assert type(DistributedStrategyFactory.create_half_async_strategy()) is HalfAsyncStrategy
    geo = DistributedStrategyFactory.create_geo_strategy(update_frequency=10)
    assert type(geo) is GeoStrategy and geo.get_program_config().geo_sgd_need_push_nums == 10
    assert type(DistributedStrategyFactory().create_async_strategy()) is AsyncStrategy


# --- 1.3 _transpile conversion and the strategy type check -----------------------------------------

def test_sync_config_becomes_sync_strategy_with_that_config():
    config = DistributeTranspilerConfig()
    strategy = strategy_from_config(config)
    assert type(strategy) is SyncStrategy and strategy.get_program_config() is config
    assert config.sync_mode is True


@pytest.mark.parametrize(
    "geo, half, expected",
    [(True, False, GeoStrategy), (False, True, HalfAsyncStrategy), (False, False, AsyncStrategy)],
)
def test_runtime_split_config_becomes_the_matching_strategy(geo, half, expected):
    config = DistributeTranspilerConfig()
    config.sync_mode = False
    config.runtime_split_send_recv = True
    config.geo_sgd_mode = geo
    config.half_async = half
    config.geo_sgd_need_push_nums = 7
    strategy = strategy_from_config(config)
    assert type(strategy) is expected and strategy.get_program_config() is config
    if expected is GeoStrategy:
        assert strategy.update_frequency == 7


def test_async_config_without_runtime_split_becomes_half_async():
    config = DistributeTranspilerConfig()
    config.sync_mode = False
    strategy = strategy_from_config(config)
    assert type(strategy) is HalfAsyncStrategy
    assert config.half_async is True and config.runtime_split_send_recv is True


def test_strategy_passes_through_conversion_unchanged():
    strategy = GeoStrategy(5)
    assert strategy_from_config(strategy) is strategy


def test_conversion_rejects_other_types():
    with pytest.raises(TypeError, match=starts("config must be an instance of DistributeTranspilerConfig")):
        strategy_from_config({"sync_mode": False})


def test_check_strategy_accepts_the_five_types():
    for strategy in (DistributeTranspilerConfig(), SyncStrategy(), HalfAsyncStrategy(), AsyncStrategy(), GeoStrategy()):
        assert check_strategy(strategy, "DistributedTranspiler") is strategy


@pytest.mark.parametrize("strategy", [None, {}, "async", ExecutionStrategy()])
def test_check_strategy_message(strategy):
    with pytest.raises(TypeError, match=starts(
        "In DistributedTranspiler mode, strategy must be an instance of DistributeTranspilerConfig, "
        "SyncStrategy, HalfAsyncStrategy, AsyncStrategy, or GeoStrategy"
    )):
        check_strategy(strategy, "DistributedTranspiler")


# --- 5.2 dispatchers ------------------------------------------------------------------------------

def test_round_robin_deals_in_turn_and_keeps_its_cursor_until_reset():
    eps = ["a:1", "b:2", "c:3"]
    dispatcher = RoundRobin(eps)
    assert dispatcher.dispatch(["w0", "w1"]) == ["a:1", "b:2"]
    assert dispatcher.dispatch(["w2", "w3"]) == ["c:3", "a:1"]
    dispatcher.reset()
    assert dispatcher.dispatch(["g0", "g1", "g2", "g3"]) == ["a:1", "b:2", "c:3", "a:1"]


def test_round_robin_places_grad_and_param_blocks_alike_after_reset():
    dispatcher = RoundRobin(SERVERS)
    grads = dispatcher.dispatch(["w@GRAD.block0", "w@GRAD.block1", "b@GRAD"])
    dispatcher.reset()
    assert dispatcher.dispatch(["w.block0", "w.block1", "b"]) == grads


def test_hash_name_places_a_name_the_same_way_every_time():
    dispatcher = HashName(SERVERS)
    first = dispatcher.dispatch(["fc_0.w_0", "fc_0.b_0", "embedding_0.w_0"])
    assert HashName(SERVERS).dispatch(["fc_0.w_0", "fc_0.b_0", "embedding_0.w_0"]) == first
    assert set(first) <= set(SERVERS)
    assert dispatcher.eps == SERVERS
