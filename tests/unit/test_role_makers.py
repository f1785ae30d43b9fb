"""Role makers: fleet's own behaviour (validation, messages, laziness, local training).

Paddle-compatibility acceptance tests are in test_paddle_compat_roles_strategies.py.
"""
import ast
import logging
import pathlib
import sys

import pytest
from hypothesis import given, settings, strategies as st

import role_makers
from fleet.errors import RoleError
from role_makers import (
    KubernetesRoleMaker,
    LocalRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleMakerBase,
    UserDefinedCollectiveRoleMaker,
    UserDefinedRoleMaker,
)
from role_makers import paddle_cloud_role_maker

ROLE_VARS = (
    "TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID",
    "POD_IP", "PADDLE_PORT", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_TRAINING_ROLE",
)
SERVERS = "127.0.0.1:6170,127.0.0.1:6171"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ROLE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(paddle_cloud_role_maker, "_local_notice_given", False)


def set_env(monkeypatch, **variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def trainer_env(monkeypatch, **overrides):
    env = dict(TRAINING_ROLE="TRAINER", PADDLE_PSERVERS_IP_PORT_LIST=SERVERS,
               PADDLE_TRAINERS_NUM="2", PADDLE_TRAINER_ID="1")
    env.update(overrides)
    set_env(monkeypatch, **{k: v for k, v in env.items() if v is not None})


def pserver_env(monkeypatch, **overrides):
    env = dict(TRAINING_ROLE="PSERVER", PADDLE_PSERVERS_IP_PORT_LIST=SERVERS,
               PADDLE_TRAINERS_NUM="2", POD_IP="127.0.0.1", PADDLE_PORT="6171")
    env.update(overrides)
    set_env(monkeypatch, **{k: v for k, v in env.items() if v is not None})


def role_error(role_maker=None):
    with pytest.raises(RoleError) as info:
        (role_maker or PaddleCloudRoleMaker()).generate_role()
    return str(info.value)


# --- PaddleCloudRoleMaker: missing and malformed variables --------------------------------

@pytest.mark.parametrize("missing", ["PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID"])
def test_trainer_missing_variable_is_a_role_error_naming_it(monkeypatch, missing):
    trainer_env(monkeypatch)
    monkeypatch.delenv(missing)
    message = role_error()
    assert message.startswith(f"{missing} is not set, but TRAINING_ROLE=TRAINER needs it; set it to ")


@pytest.mark.parametrize("missing", ["PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "POD_IP", "PADDLE_PORT"])
def test_pserver_missing_variable_is_a_role_error_naming_it(monkeypatch, missing):
    pserver_env(monkeypatch)
    monkeypatch.delenv(missing)
    assert role_error().startswith(f"{missing} is not set, but TRAINING_ROLE=PSERVER needs it")


def test_server_list_with_two_colons_names_the_variable_value_and_shape(monkeypatch):
    trainer_env(monkeypatch, PADDLE_PSERVERS_IP_PORT_LIST="a:b:c")
    assert role_error() == (
        "PADDLE_PSERVERS_IP_PORT_LIST='a:b:c' is not a comma list of host:port: entry 'a:b:c' "
        "must have exactly one ':' between host and port (an IPv6 host goes in brackets: "
        "[fd00::1]:6170); set it like "
        "'127.0.0.1:6170,127.0.0.1:6171'"
    )


@pytest.mark.parametrize(
    "value, problem",
    [
        ("127.0.0.1", "entry '127.0.0.1' must have exactly one ':'"),
        ("127.0.0.1:0", "entry '127.0.0.1:0' has port '0', expected an integer in 1..65535"),
        ("127.0.0.1:65536", "has port '65536', expected an integer in 1..65535"),
        ("127.0.0.1:http", "has port 'http'"),
        (":6170", "entry ':6170' has an empty or blank-padded host"),
        ("127.0.0.1:6170,", "an entry is empty"),
        ("", "an entry is empty"),
        ("127.0.0.1:6170,127.0.0.1:6170", "entry '127.0.0.1:6170' appears twice"),
    ],
)
def test_malformed_server_list_says_what_is_wrong(monkeypatch, value, problem):
    trainer_env(monkeypatch, PADDLE_PSERVERS_IP_PORT_LIST=value)
    message = role_error()
    assert message.startswith(f"PADDLE_PSERVERS_IP_PORT_LIST={value!r} is not a comma list of host:port: ")
    assert problem in message


def test_spaces_around_server_list_entries_are_ignored(monkeypatch):
    trainer_env(monkeypatch, PADDLE_PSERVERS_IP_PORT_LIST=" 127.0.0.1:6170 , 127.0.0.1:6171 ")
    assert PaddleCloudRoleMaker().get_pserver_endpoints() == ["127.0.0.1:6170", "127.0.0.1:6171"]


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5", ""])
def test_bad_trainers_num_names_variable_and_expected_range(monkeypatch, value):
    trainer_env(monkeypatch, PADDLE_TRAINERS_NUM=value)
    assert role_error() == (
        f"PADDLE_TRAINERS_NUM={value!r} is not an integer >= 1; set it to the number of workers"
    )


@pytest.mark.parametrize("value", ["2", "-1", "x"])
def test_trainer_id_outside_zero_to_trainers_num_is_rejected(monkeypatch, value):
    trainer_env(monkeypatch, PADDLE_TRAINER_ID=value)
    assert role_error() == (
        f"PADDLE_TRAINER_ID={value!r} is not an integer in [0, 2); "
        "set it to this worker's index in [0, PADDLE_TRAINERS_NUM=2)"
    )


@pytest.mark.parametrize("value", ["0", "65536", "port"])
def test_bad_paddle_port_is_rejected(monkeypatch, value):
    pserver_env(monkeypatch, PADDLE_PORT=value)
    assert role_error().startswith(f"PADDLE_PORT={value!r} is not an integer in [1, 65536)")


def test_pserver_not_in_the_list_names_the_list_and_its_contents(monkeypatch):
    pserver_env(monkeypatch, PADDLE_PORT="7000")
    assert role_error() == (
        "POD_IP:PADDLE_PORT='127.0.0.1:7000' is not in PADDLE_PSERVERS_IP_PORT_LIST, which holds "
        "['127.0.0.1:6170', '127.0.0.1:6171']; set POD_IP and PADDLE_PORT to this server's "
        "entry of that list"
    )


@pytest.mark.parametrize("value", ["WORKER", "trainer", ""])
def test_unknown_training_role_is_rejected_even_when_empty(monkeypatch, value):
    trainer_env(monkeypatch, TRAINING_ROLE=value)
    assert role_error() == (
        f"TRAINING_ROLE={value!r} is not valid: TRAINING_ROLE must be PSERVER or TRAINER "
        "(or unset it to train locally)"
    )


def test_trainer_endpoints_are_read_when_set(monkeypatch):
    trainer_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000,10.0.0.2:7000")
    assert PaddleCloudRoleMaker().get_trainer_endpoints() == ["10.0.0.1:7000", "10.0.0.2:7000"]


def test_empty_trainer_endpoints_mean_unknown(monkeypatch):
    trainer_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="")
    assert PaddleCloudRoleMaker().get_trainer_endpoints() == []


def test_trainer_endpoints_must_list_one_endpoint_per_worker(monkeypatch):
    trainer_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000")
    assert role_error() == (
        "PADDLE_TRAINER_ENDPOINTS='10.0.0.1:7000' lists 1 endpoints but PADDLE_TRAINERS_NUM=2; "
        "list one host:port per worker, or unset PADDLE_TRAINER_ENDPOINTS"
    )


def test_malformed_trainer_endpoints_are_rejected(monkeypatch):
    trainer_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1,10.0.0.2")
    assert role_error().startswith(
        "PADDLE_TRAINER_ENDPOINTS='10.0.0.1,10.0.0.2' is not a comma list of host:port"
    )


# --- laziness, repr, regeneration ---------------------------------------------------------

def test_environment_is_read_at_first_use_not_at_construction(monkeypatch):
    role_maker = PaddleCloudRoleMaker()
    trainer_env(monkeypatch)
    assert role_maker.worker_index() == 1
    assert role_maker.is_local() is False


def test_a_failed_generate_role_can_be_retried_after_fixing_the_environment(monkeypatch):
    trainer_env(monkeypatch, PADDLE_TRAINER_ID=None)
    role_maker = PaddleCloudRoleMaker()
    with pytest.raises(RoleError):
        role_maker.is_worker()
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    assert role_maker.is_first_worker()


def test_role_is_fixed_once_generated(monkeypatch):
    trainer_env(monkeypatch)
    role_maker = PaddleCloudRoleMaker()
    role_maker.generate_role()
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    assert role_maker.worker_index() == 1


def test_repr_never_reads_a_bad_environment(monkeypatch):
    trainer_env(monkeypatch, TRAINING_ROLE="bogus")
    assert repr(PaddleCloudRoleMaker()) == "<PaddleCloudRoleMaker (role not generated yet)>"


def test_endpoint_getters_return_copies(monkeypatch):
    trainer_env(monkeypatch)
    role_maker = PaddleCloudRoleMaker()
    role_maker.get_pserver_endpoints().append("x:1")
    assert role_maker.server_num() == 2


# --- local training ---------------------------------------------------------------------

def test_unset_training_role_is_one_local_worker_like_local_role_maker(monkeypatch):
    set_env(monkeypatch, PADDLE_TRAINERS_NUM="8", PADDLE_TRAINER_ID="3")  # ignored when local
    cloud, local = PaddleCloudRoleMaker(), LocalRoleMaker()
    for role_maker in (cloud, local):
        assert role_maker.is_worker() and not role_maker.is_server()
        assert role_maker.is_first_worker() and role_maker.is_local()
        assert (role_maker.worker_num(), role_maker.worker_index(), role_maker.server_num()) == (1, 0, 0)
        assert role_maker.get_pserver_endpoints() == [] and role_maker.get_trainer_endpoints() == []
        assert role_maker.role_id() == 0
    assert cloud.to_string() == local.to_string()


def test_local_training_is_announced_once_per_process_on_the_fleet_logger(caplog):
    with caplog.at_level(logging.INFO, logger="fleet"):
        PaddleCloudRoleMaker().generate_role()
        PaddleCloudRoleMaker().generate_role()
    records = [r for r in caplog.records if r.name == "fleet"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage().startswith("TRAINING_ROLE is not set: PaddleCloudRoleMaker runs")


def test_local_role_maker_logs_nothing(caplog):
    with caplog.at_level(logging.DEBUG, logger="fleet"):
        LocalRoleMaker().generate_role()
    assert caplog.records == []


# --- collective mode ----------------------------------------------------------------------

def test_collective_mode_reads_trainer_endpoints_and_id(monkeypatch):
    set_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000,10.0.0.2:7000", PADDLE_TRAINER_ID="1")
    role_maker = PaddleCloudRoleMaker(is_collective=True)
    assert role_maker.is_worker() and not role_maker.is_first_worker()
    assert (role_maker.worker_num(), role_maker.worker_index(), role_maker.server_num()) == (2, 1, 0)
    assert role_maker.is_local() is False


def test_collective_mode_trainer_id_defaults_to_zero(monkeypatch):
    set_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000")
    assert PaddleCloudRoleMaker(is_collective=True).is_first_worker()


def test_collective_mode_needs_trainer_endpoints():
    assert role_error(PaddleCloudRoleMaker(is_collective=True)).startswith(
        "PADDLE_TRAINER_ENDPOINTS is not set, but PaddleCloudRoleMaker(is_collective=True) needs it"
    )


def test_collective_mode_accepts_only_trainers(monkeypatch):
    set_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000", PADDLE_TRAINING_ROLE="PSERVER")
    assert role_error(PaddleCloudRoleMaker(is_collective=True)).startswith(
        "PADDLE_TRAINING_ROLE='PSERVER' is not valid in collective mode"
    )


def test_collective_mode_trainer_id_must_index_the_endpoints(monkeypatch):
    set_env(monkeypatch, PADDLE_TRAINER_ENDPOINTS="10.0.0.1:7000", PADDLE_TRAINER_ID="1")
    assert role_error(PaddleCloudRoleMaker(is_collective=True)).startswith(
        "PADDLE_TRAINER_ID='1' is not an integer in [0, 1)"
    )


def test_is_collective_must_be_a_bool():
    with pytest.raises(TypeError, match="is_collective must be a bool, got 'yes'"):
        PaddleCloudRoleMaker(is_collective="yes")


# --- user-defined role makers: fleet's additions --------------------------------------------

def test_user_defined_endpoint_must_be_host_port():
    with pytest.raises(RoleError) as info:
        UserDefinedRoleMaker(0, Role.WORKER, 1, ["127.0.0.1:6170", "localhost"])
    assert str(info.value) == (
        "server_endpoints[1]='localhost' is not host:port (entry 'localhost' must have exactly "
        "one ':' between host and port (an IPv6 host goes in brackets: [fd00::1]:6170)); "
        "write it like '127.0.0.1:6170'"
    )


def test_user_defined_worker_id_must_be_below_worker_num():
    with pytest.raises(RoleError, match=r"^if role is Role.WORKER, current_id must be less than or "
                       r"equal to worker_num - 1: got current_id=2 with worker_num=2$"):
        UserDefinedRoleMaker(2, Role.WORKER, 2, ["127.0.0.1:6170"])


@pytest.mark.parametrize("current_id", [True, 1.0, "0"])
def test_user_defined_current_id_must_be_a_real_int(current_id):
    with pytest.raises(TypeError, match="^current_id must be as int"):
        UserDefinedRoleMaker(current_id, Role.WORKER, 2, ["127.0.0.1:6170"])


def test_user_defined_role_accepts_paddle_integer_roles():
    role_maker = UserDefinedRoleMaker(1, 2, 3, ["127.0.0.1:6170", "127.0.0.1:6171"])
    assert role_maker.is_server() and role_maker.server_index() == 1 and role_maker.role_id() == 1


@pytest.mark.parametrize("role", [3, True, "WORKER", None])
def test_user_defined_role_rejects_non_roles(role):
    with pytest.raises(TypeError, match="^role must be as Role"):
        UserDefinedRoleMaker(0, role, 1, ["127.0.0.1:6170"])


def test_user_defined_role_maker_is_never_local():
    role_maker = UserDefinedRoleMaker(0, Role.WORKER, 1, ["127.0.0.1:6170"])
    assert role_maker.is_local() is False and role_maker.get_trainer_endpoints() == []


def test_user_defined_collective_role_maker_has_workers_only():
    role_maker = UserDefinedCollectiveRoleMaker(1, ["10.0.0.1:7000", "10.0.0.2:7000"])
    assert role_maker.is_worker() and not role_maker.is_server()
    assert role_maker.worker_num() == 2 and role_maker.server_num() == 0
    assert role_maker.get_trainer_endpoints() == ["10.0.0.1:7000", "10.0.0.2:7000"]


def test_base_class_generate_role_must_be_implemented():
    with pytest.raises(NotImplementedError, match="^Please implement this method in child class$"):
        RoleMakerBase().is_worker()


def test_every_role_maker_is_a_role_maker_base():
    for cls in (LocalRoleMaker, PaddleCloudRoleMaker, UserDefinedRoleMaker, UserDefinedCollectiveRoleMaker,
                KubernetesRoleMaker):
        assert issubclass(cls, RoleMakerBase)


def test_role_makers_offer_no_collective_helpers():
    for name in ("barrier_worker", "all_reduce_worker", "all_gather", "barrier_all"):
        assert not hasattr(RoleMakerBase, name)


# --- layering ----------------------------------------------------------------------------

def _imported_modules(package_dir):
    for path in sorted(pathlib.Path(package_dir).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from ((path.name, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                yield path.name, node.module


@pytest.mark.parametrize("package", ["role_makers", "strategies"])
def test_layer_two_packages_import_only_stdlib_numpy_layer_zero_and_themselves(package):
    # Layer 0: fleet.errors, fleet.logs (KubernetesRoleMaker's waits), the endpoint and integer parsers.
    package_dir = pathlib.Path(role_makers.__file__).parent.parent / package
    for filename, module in _imported_modules(package_dir):
        top = module.split(".")[0]
        allowed = (
            module in ("fleet.errors", "fleet.logs", "fleet.endpoints", "fleet.envvars")
            or top in (package, "numpy")
            or top in sys.stdlib_module_names
            # the optional extra of MPISymetricRoleMaker, imported inside a function
            or (package, filename, top) == ("role_makers", "mpi_role_maker.py", "mpi4py")
        )
        assert allowed, f"{package}/{filename} imports {module}"


# --- property: any well-formed server list round-trips ----------------------------------------

_hosts = st.sampled_from(["127.0.0.1", "10.0.0.7", "node-3.cluster.local", "localhost"])
_endpoints = st.lists(
    st.tuples(_hosts, st.integers(1, 65535)).map(lambda hp: f"{hp[0]}:{hp[1]}"),
    min_size=1, max_size=8, unique=True,
)


@settings(max_examples=50, deadline=None)
@given(servers=_endpoints, worker_num=st.integers(1, 16), data=st.data())
def test_any_well_formed_cluster_environment_is_read_back_exactly(servers, worker_num, data):
    trainer_id = data.draw(st.integers(0, worker_num - 1))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINING_ROLE", "TRAINER")
        env.setenv("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(servers))
        env.setenv("PADDLE_TRAINERS_NUM", str(worker_num))
        env.setenv("PADDLE_TRAINER_ID", str(trainer_id))
        role_maker = PaddleCloudRoleMaker()
        assert role_maker.get_pserver_endpoints() == servers
        assert (role_maker.worker_num(), role_maker.worker_index()) == (worker_num, trainer_id)
        assert role_maker.is_first_worker() == (trainer_id == 0)
