"""FleetUtil in local training (one process: every reduction is the local value) and its
errors: Paddle's default AUC state names point at fleet's, bad modes are named."""
import numpy as np
import pytest

import fleet
import fleet.fluid as fluid
from fleet.errors import ConfigError
from fleet.fleet_util import FleetUtil


def test_local_fleet_util_reports_the_local_values(fresh_fleet, capsys):
    x = fluid.layers.data(name="x", shape=[2], dtype="float32")
    y = fluid.layers.data(name="y", shape=[1], dtype="int64")
    _, _, states = fluid.layers.auc(fluid.layers.softmax(x), y)
    exe = fluid.Executor()
    exe.run(fluid.default_startup_program())
    exe.run(feed={"x": np.array([[0.0, 2.0], [2.0, 0.0], [0.0, 1.0]], np.float32), "y": np.array([[1], [0], [0]])},
            fetch_list=[states[2]])
    util = FleetUtil()
    assert util.get_global_auc(fluid.global_scope(), states[2].name, states[3].name) == 1.0
    util.print_global_auc(fluid.global_scope(), states[2].name, states[3].name, print_prefix="pass 1")
    util.rank0_print("hello")
    util.print_on_rank("not me", 1)
    assert capsys.readouterr().out == "pass 1 global auc = 1.0\nhello\n"
    assert util.all_reduce(np.array([3, 4]), mode="max").tolist() == [3, 4]
    assert util.all_gather({"a": 1}) == [{"a": 1}]
    assert util.get_file_shard(["f1", "f2"]) == ["f1", "f2"]
    util.barrier()
    util.set_zero(states[2].name)
    assert not fluid.global_scope()[states[2].name].any()
    with pytest.raises(ConfigError, match=r"get_global_auc: stat_pos='_generated_var_2' is not in the scope; fleet "
                                          r"names the auc layer's statistics \['auc.stat_"):
        util.get_global_auc()
    with pytest.raises(ConfigError, match=r"all_reduce mode='mean' must be one of \['max', 'min', 'sum'\]"):
        util.all_reduce(1, mode="mean")
    with pytest.raises(ConfigError, match="comm_world='server'\\): fleet reduces over the workers only"):
        util.barrier(comm_world="server")
    with pytest.raises(ConfigError, match="FleetUtil\\(mode='gpu'\\): mode is 'pslib' or 'transpiler'"):
        FleetUtil("gpu")
    assert isinstance(fleet.util, FleetUtil) and fleet.FleetUtil is FleetUtil
