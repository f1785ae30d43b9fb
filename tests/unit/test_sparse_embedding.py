"""sparse_embedding / embedding(entry=): what they build, how programs keep the entry, and
the strategy's per-table accessor config on its way into the plan."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
import fleet.layers as layers
from fleet.entries import CtrAccessorConfig
from fleet.errors import ConfigError
from fleet.fluid import input as fluid_input
from fleet.framework.program import Program
from fleet.optimizer import SGD
from fleet.transpiler.plan import build_plan
from fleet.transpiler.worker_program import transpile_worker
from strategies import DistributedStrategyFactory
from strategies.distributed_strategy import SPARSE_TABLE_FIELDS

EPS = ["127.0.0.1:7001", "127.0.0.1:7002"]


def _model(entry, table="emb", with_show_click=True, minimize=True):
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        if with_show_click:
            layers.data("show", shape=[1], dtype="float32")
            layers.data("click", shape=[1], dtype="float32")
        label = layers.data("label", shape=[1], dtype="float32")
        emb = layers.sparse_embedding(ids, [100, 4], entry=entry, param_attr=fleet.ParamAttr(name=table))
        pooled = layers.sequence_pool(emb, "sum")
        logit = layers.fc(pooled, 1)
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, label))
        if minimize:
            SGD(0.1).minimize(loss)
    return main, startup


def _lookup(program):
    return next(op for op in program.global_block().ops if op.type == "lookup_table")


def test_sparse_embedding_builds_a_distributed_lookup_with_the_entry_as_paddles_attr_string():
    main, _ = _model(fleet.CountFilterEntry(2))
    op = _lookup(main)
    assert op.attr("is_distributed") is True and op.attr("is_sparse") is True
    assert op.attr("entry") == "count_filter_entry:2"
    assert op.attr("table_class") == "MemorySparseTable" and op.attr("is_test") is False
    param = main.global_block().var("emb")
    assert param.is_distributed and param.entry == "count_filter_entry:2"


def test_the_entry_survives_clone_and_serialization():
    main, _ = _model(fleet.ShowClickEntry("show", "click"))
    for program in (main.clone(for_test=True), Program.parse_from_string(main.serialize_to_string()),
                    Program.from_dict(main.to_dict())):
        assert program.global_block().var("emb").entry == "show_click_entry:show:click"
        assert _lookup(program).attr("entry") == "show_click_entry:show:click"


def test_embedding_takes_an_entry_only_on_a_distributed_table():
    with fw.program_guard(fw.Program(), fw.Program()):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        with pytest.raises(ConfigError, match=r"this table is not is_distributed: pass is_distributed=True"):
            layers.embedding(ids, [10, 4], is_sparse=True, entry=fleet.CountFilterEntry(2))
        out = layers.embedding(ids, [10, 4], is_distributed=True, entry=fleet.ProbabilityEntry(0.5))
        assert _lookup(out.block.program).attr("entry") == "probability_entry:0.5"
        out = fluid_input.embedding(ids, [10, 4], is_distributed=True, entry=fleet.CountFilterEntry(3),
                                    param_attr="t2")
        assert out.block.var("t2").entry == "count_filter_entry:3"


def test_a_table_without_entry_builds_exactly_as_before():
    with fw.program_guard(fw.Program(), fw.Program()):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        out = layers.embedding(ids, [10, 4], is_distributed=True, param_attr="plain")
        op = _lookup(out.block.program)
        assert "entry" not in op.attrs and out.block.var("plain").entry is None


@pytest.mark.parametrize("kwargs, message", [
    ({"table_class": "HashTable"}, r"table_class must be in \[MemorySparseTable, CommonSparseTable, SSDSparseTable\]"),
    ({"entry": "count_filter_entry:2"}, r"entry must be instance in \[fleet.ProbabilityEntry"),
    ({"dtype": "float64"}, r"sparse tables hold float32 rows; pass dtype='float32'"),
    ({"entry": fleet.ShowClickEntry("shows", "click")},
     r"ShowClickEntry show input 'shows' is not a variable of this program: declare it"),
])
def test_sparse_embedding_refuses_what_paddle_refuses(kwargs, message):
    with fw.program_guard(fw.Program(), fw.Program()):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        layers.data("click", shape=[1], dtype="float32")
        with pytest.raises(ConfigError, match=message):
            layers.sparse_embedding(ids, [10, 4], **kwargs)


def test_entries_are_exported_from_fleet_and_fleet_entries():
    assert fleet.CountFilterEntry is fleet.entries.CountFilterEntry
    assert fleet.ShowClickEntry("s", "c")._to_attr() == "show_click_entry:s:c"
    assert fleet.ProbabilityEntry(0.25)._to_attr() == "probability_entry:0.25"


def test_the_worker_prefetch_reads_the_show_and_click_inputs_of_a_show_click_entry():
    main, startup = _model(fleet.ShowClickEntry("show", "click"))
    plan = build_plan(main, DistributedStrategyFactory.create_async_strategy(), EPS, 1)
    worker, _ = transpile_worker(main, startup, plan)
    prefetch = next(op for op in worker.global_block().ops if op.type == "prefetch")
    assert prefetch.input("Show") == ["show"] and prefetch.input("Click") == ["click"]
    assert prefetch.attr("entry") == "show_click_entry:show:click"
    assert plan.params["emb"].entry == "show_click_entry:show:click" and plan.params["emb"].has_statistics
    assert plan.params["emb"].accessor is None


# ------------------------------------------------------------------ strategy config
def test_the_strategy_knows_every_ctr_accessor_field():
    assert SPARSE_TABLE_FIELDS == CtrAccessorConfig.field_names()


@pytest.mark.parametrize("factory", ["sync", "async", "half_async", "geo", "hybrid"])
def test_every_parameter_server_strategy_takes_a_sparse_table_config(factory):
    strategy = getattr(DistributedStrategyFactory, f"create_{factory}_strategy")()
    strategy.set_sparse_table_config("emb", sparse_delete_threshold=0.5)
    strategy.set_sparse_table_config(None, nonclk_coeff=0.2)
    assert strategy.sparse_table_config("emb") == {"delete_threshold": 0.5, "nonclk_coeff": 0.2}
    assert strategy.sparse_table_config("other") == {"nonclk_coeff": 0.2}


def test_the_accessor_config_reaches_the_plan_and_a_table_without_one_has_none():
    main, _ = _model(None, with_show_click=False)
    strategy = DistributedStrategyFactory.create_sync_strategy()
    assert build_plan(main, strategy, EPS, 1).params["emb"].has_statistics is False
    strategy.set_sparse_table_config("emb", show_click_decay_rate=0.5, sparse_delete_threshold=2)
    pplan = build_plan(main, strategy, EPS, 1).params["emb"]
    assert pplan.accessor == CtrAccessorConfig(show_click_decay_rate=0.5, delete_threshold=2).to_dict()
    assert pplan.has_statistics and pplan.entry is None


def test_sparse_table_config_errors_name_the_field_the_table_and_the_valid_ones():
    strategy = DistributedStrategyFactory.create_async_strategy()
    with pytest.raises(ConfigError, match=r"field 'decay' is unknown; valid fields are nonclk_coeff, click_coeff"):
        strategy.set_sparse_table_config("emb", decay=0.5)
    strategy.set_sparse_table_config("embs", delete_threshold=1)
    main, _ = _model(None, with_show_click=False)
    with pytest.raises(ConfigError, match=r"names table 'embs', which is not a distributed table of this program; "
                                          r"its distributed tables are \['emb'\]"):
        build_plan(main, strategy, EPS, 1)
    strategy = DistributedStrategyFactory.create_async_strategy()
    strategy.set_sparse_table_config("emb", show_click_decay_rate=2)
    with pytest.raises(ConfigError, match=r"for table 'emb': CtrAccessorConfig show_click_decay_rate=2.0: must be "
                                          r"in \(0, 1\]"):
        build_plan(main, strategy, EPS, 1)


def test_collective_strategy_refuses_a_sparse_table_config():
    with pytest.raises(ConfigError, match=r"CollectiveStrategy has no servers: use "
                                          r"DistributedStrategyFactory.create_hybrid_strategy\(\)"):
        fleet.CollectiveStrategy().set_sparse_table_config(delete_threshold=1)


def test_prefetch_statistics_sum_the_show_and_click_of_each_occurrence():
    from fleet.communicator.statistics import occurrence_statistics, unique_statistics
    from fleet.framework.tensor import LoDTensor

    ids = LoDTensor.from_lengths(np.array([5, 7, 5, 9], np.int64), np.array([2, 0, 2], np.int64))
    show = np.array([[2], [4], [3]], np.float32)
    click = np.array([[1], [0], [0]], np.float32)
    flat, shows, clicks = occurrence_statistics([ids], show, click)
    np.testing.assert_array_equal(shows, [2, 2, 3, 3])
    uniq, show_sums, click_sums = unique_statistics(flat, shows, clicks)
    np.testing.assert_array_equal(uniq, [5, 7, 9])
    np.testing.assert_array_equal(show_sums, [5, 2, 3])
    np.testing.assert_array_equal(click_sums, [1, 1, 0])
    uniq, counts, zeros = unique_statistics(flat)
    np.testing.assert_array_equal(counts, [2, 1, 1])
    np.testing.assert_array_equal(zeros, [0, 0, 0])
