"""Distributed checkpoints without sockets: servers' state read out in chunks, saved whole,
and re-split onto 1, 2 or 3 servers (tests/unit/fake_cluster.py runs the servers in this
process behind the real message encoding)."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError, ServerError
from fleet.framework import io as fio
from fleet.framework.tensor import SparseRows
from fleet.server_saves import write_server_params
from fleet.server.checkpoint import ShardCursor
from fleet.tables.sparse_table import SparseTable
from strategies import DistributedStrategyFactory
from fake_cluster import Cluster

ROWS = 4000  # emb: 4000 x 8 = 32000 elements, a block per server up to 3 servers
TABLE_IDS = np.array([0, 1, 2, 5, -1, -7, 2**63 - 1, -2**63, 123456789012, 17, 40, 41], dtype=np.int64)


def _program(opt="adam"):
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        dids = layers.data("dids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sequence_pool(layers.embedding(ids, size=[ROWS, 8], is_sparse=True, param_attr="emb"), "sum")
        table = fleet.ParamAttr(name="dtable", initializer=fleet.initializer.Uniform(-1.0, 1.0))
        demb = layers.sequence_pool(layers.embedding(dids, size=[10, 3], is_distributed=True, param_attr=table),
                                    "sum")
        h = layers.fc(layers.concat([emb, demb, x], axis=1), 1800, param_attr="w", bias_attr="b")  # [15, 1800]
        out = layers.fc(h, 2, param_attr="w2", bias_attr="b2")
        {"adam": lambda: optimizer.Adam(0.01), "sgd": lambda: optimizer.SGD(0.1),
         "adagrad": lambda: optimizer.Adagrad(0.1),
         "rmsprop": lambda: optimizer.RMSProp(0.01, centered=True, momentum=0.5),
         "ftrl": lambda: optimizer.Ftrl(0.1, l1=0.01), "lamb": lambda: optimizer.Lamb(0.01),
         "decayed_adagrad": lambda: optimizer.DecayedAdagrad(0.1), "adadelta": lambda: optimizer.Adadelta(1.0),
         "adamax": lambda: optimizer.Adamax(0.01)}[opt]().minimize(layers.mean(out))
    startup.random_seed = 5
    return main, startup


def _strategy():
    return DistributedStrategyFactory.create_async_strategy()


def _cluster(n, dirname=None, opt="adam", max_message_bytes=1 << 30):
    main, startup = _program(opt)
    return Cluster(main, startup, _strategy(), n, dirname, max_message_bytes)


def _train(cluster, steps=3, seed=0, emb_rows=1000):
    """Pushes gradients: dense ones everywhere, emb rows only below ``emb_rows`` (so
    later blocks of emb never step), table ids from TABLE_IDS."""
    rng = np.random.default_rng(seed)
    grad = {p.name: p.grad for p in cluster.plan.params.values()}
    for _ in range(steps):
        rows = rng.integers(0, emb_rows, 20)
        ids = np.concatenate([TABLE_IDS, TABLE_IDS[rng.integers(0, len(TABLE_IDS), 6)]])
        cluster.push({
            grad["w"]: rng.normal(size=(15, 1800)).astype(np.float32),
            grad["b"]: rng.normal(size=1800).astype(np.float32),
            grad["w2"]: rng.normal(size=(1800, 2)).astype(np.float32),
            grad["b2"]: rng.normal(size=2).astype(np.float32),
            grad["emb"]: SparseRows(rows, rng.normal(size=(20, 8)).astype(np.float32), ROWS),
            grad["dtable"]: SparseRows(ids, rng.normal(size=(len(ids), 3)).astype(np.float32), 2**63 - 1),
        })


def _save(cluster, dirname, with_state=True):
    with fio.VarsWriter(str(dirname), {"server_num": len(cluster.servers)}) as writer:
        tables = write_server_params(writer, cluster.comm, cluster.plan.params.values(), with_state)
    return str(dirname), tables


def _table(saved, name="dtable", keys=("moment1", "moment2")):
    """{id: (value, *row state)} of a saved distributed table."""
    ids = saved[name + "@ids"]
    cols = [saved[name + "@values"]] + [saved[f"{name}_{k}_0@values"] for k in keys]
    return {int(i): tuple(c[j] for c in cols) for j, i in enumerate(ids)}


def _assert_tables_equal(a, b):
    assert sorted(a) == sorted(b)
    for row_id in a:
        for x, y in zip(a[row_id], b[row_id]):
            np.testing.assert_array_equal(x, y, err_msg=str(row_id))


# ------------------------------------------------------------------ saving
def test_a_save_holds_every_parameter_and_its_state_whole_as_the_servers_hold_them(tmp_path):
    cluster = _cluster(2)
    _train(cluster)
    dirname, tables = _save(cluster, tmp_path / "ckpt")
    saved = fio.read_vars(dirname)
    whole, server_tables = cluster.whole()
    for name in ("w", "b", "w2", "b2", "emb", "w_moment1_0", "w_moment2_0", "emb_moment1_0", "emb_moment2_0",
                 "b2_moment2_0"):
        np.testing.assert_array_equal(saved[name], whole[name], err_msg=name)
        assert saved[name].dtype == np.float32
    # the table: one array per kind, every row of both servers, server 0's rows first
    assert tables == {"dtable": {"rows": len(set(TABLE_IDS.tolist())), "dim": 3}}
    assert np.all(np.mod(saved["dtable@ids"][:np.sum(np.mod(TABLE_IDS, 2) == 0)], 2) == 0)
    table = _table(saved)
    assert sorted(table) == sorted(server_tables["dtable"])
    for row_id, (value, m1, m2) in table.items():
        row = server_tables["dtable"][row_id]
        np.testing.assert_array_equal(value, row["values"])
        np.testing.assert_array_equal(m1, row["state.moment1"])
        np.testing.assert_array_equal(m2, row["state.moment2"])
    # scalar state: local training's name for the row-0 block, plus one value per block
    per_block = whole["emb_beta1_pow_0@per_block"]
    assert per_block[0][0] != per_block[1][0]  # block 1 met no rows: it did not step
    np.testing.assert_array_equal(saved["emb_beta1_pow_0"], per_block[0])
    np.testing.assert_array_equal(saved["emb_beta1_pow_0@blocks"], np.stack([per_block[0], per_block[1]]))
    np.testing.assert_array_equal(saved["emb@block_offsets"], [0, ROWS // 2])
    assert saved["w_beta2_pow_0"].dtype == np.float64 and saved["dtable_beta1_pow_0@shards"].shape == (2, 1)


def test_a_small_message_limit_reads_in_many_chunks_and_saves_the_same_bytes(tmp_path):
    big = _cluster(2)
    _train(big)
    dirname, _ = _save(big, tmp_path / "a")
    small = _cluster(2, dirname, max_message_bytes=1 << 16)  # 16 KiB of arrays per answer
    a, b = fio.read_vars(dirname), fio.read_vars(_save(small, tmp_path / "b")[0])
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    requests = [op for c in small.clients.values() for op in c.requests]
    assert requests.count("pull_state") > 30 and requests.count("pull_shard") >= 2
    tiny = _cluster(2, dirname, max_message_bytes=1 << 14)
    with pytest.raises(ConfigError, match=r"one row of 'w' with its optimizer state is 21600 bytes, too large "
                                          r"to read within FLEET_MAX_MESSAGE_BYTES=16384; raise"):
        _save(tiny, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_an_inference_save_leaves_optimizer_state_out(tmp_path):
    cluster = _cluster(2)
    _train(cluster, steps=1)
    saved = fio.read_vars(_save(cluster, tmp_path / "m", with_state=False)[0])
    assert sorted(saved) == ["b", "b2", "dtable@ids", "dtable@values", "emb", "w", "w2"]


# ------------------------------------------------------------------ loading
@pytest.mark.parametrize("saved_on, loaded_on", [(1, 2), (2, 3), (2, 1), (3, 2), (2, 2)])
def test_a_checkpoint_loads_onto_any_server_count_and_saves_back_the_same(tmp_path, saved_on, loaded_on):
    first = _cluster(saved_on)
    _train(first)
    dirname, _ = _save(first, tmp_path / "ckpt")
    saved = fio.read_vars(dirname)
    second = _cluster(loaded_on, dirname)
    # each server holds exactly its blocks' rows and its id % server_num share
    for index, ps in enumerate(second.servers.values()):
        for name, (pplan, block, table) in ps.blocks.items():
            state = table.state_dict()
            np.testing.assert_array_equal(state["value"], block.rows_of(saved[pplan.name]))
            np.testing.assert_array_equal(state["state.moment2"], block.rows_of(saved[pplan.name + "_moment2_0"]))
        for name, (pplan, table) in ps.shards.items():
            ids = table.state_dict()["ids"]
            assert np.all(np.mod(ids, loaded_on) == index)
    again = fio.read_vars(_save(second, tmp_path / "again")[0])
    for name, value in saved.items():
        if name.startswith("dtable") and "@" in name or name.endswith(("@blocks", "@block_offsets")):
            continue
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    _assert_tables_equal(_table(again), _table(saved))
    if saved_on == loaded_on:  # the same layout: every array bit-identical, table order included
        assert sorted(again) == sorted(saved)
        for name, value in saved.items():
            np.testing.assert_array_equal(again[name], value, err_msg=name)


def test_scalar_state_follows_the_rows_when_blocks_are_re_split(tmp_path):
    first = _cluster(2)
    _train(first, emb_rows=ROWS // 2)  # block 0 (rows 0..1999) steps, block 1 does not
    dirname, _ = _save(first, tmp_path / "ckpt")
    saved = fio.read_vars(dirname)
    b0, b1 = saved["emb_beta1_pow_0@blocks"]
    assert b0[0] < b1[0]
    second = _cluster(3, dirname)  # blocks start at rows 0, 1334, 2668
    got = {}
    for ps in second.servers.values():
        for name, (pplan, block, table) in ps.blocks.items():
            if pplan.name == "emb":
                got[block.row_offset] = table.state_dict()["state.beta1_pow"]
    assert sorted(got) == [0, 1334, 2668]
    np.testing.assert_array_equal(got[0], b0)
    np.testing.assert_array_equal(got[1334], b0)  # its first row was in saved block 0
    np.testing.assert_array_equal(got[2668], b1)


def test_a_checkpoint_of_local_training_warm_starts_servers(tmp_path, monkeypatch):
    import fleet.base
    from role_makers import LocalRoleMaker

    monkeypatch.setattr(fleet.base, "fleet", fleet.base.Fleet())
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "1")  # set values, not trained ones, are saved here
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        fleet.init(LocalRoleMaker())
        main, startup = _program()
        exe = fleet.Executor()
        exe.run(startup)
        scope = fleet.global_scope()
        scope["dtable_moment1_0"][...] = 0.5  # a local is_distributed table is a dense [10, 3] array
        fleet.save_persistables(exe, str(tmp_path / "local"), main_program=main)
        local = {n: np.array(scope[n]) for n in ("w", "emb", "dtable", "dtable_moment1_0")}
    fw.reset_default_programs()
    cluster = _cluster(3, str(tmp_path / "local"))
    saved = fio.read_vars(_save(cluster, tmp_path / "dist")[0])
    np.testing.assert_array_equal(saved["w"], local["w"])
    np.testing.assert_array_equal(saved["emb"], local["emb"])
    table = _table(saved)
    assert sorted(table) == list(range(10))  # row i of the local table is id i
    for row_id, (value, m1, _) in table.items():
        np.testing.assert_array_equal(value, local["dtable"][row_id])
        np.testing.assert_array_equal(m1, local["dtable_moment1_0"][row_id])


def test_a_distributed_checkpoint_loads_into_local_training_where_ids_fit(tmp_path, monkeypatch):
    import fleet.base
    from role_makers import LocalRoleMaker

    cluster = _cluster(2)
    ids = np.array([0, 3, 9], dtype=np.int64)
    grad = {p.name: p.grad for p in cluster.plan.params.values()}
    cluster.push({grad["dtable"]: SparseRows(ids, np.ones((3, 3), np.float32), 2**63 - 1)})
    dirname, _ = _save(cluster, tmp_path / "dist")
    saved = fio.read_vars(dirname)
    monkeypatch.setattr(fleet.base, "fleet", fleet.base.Fleet())
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        fleet.init(LocalRoleMaker())
        main, startup = _program()
        exe = fleet.Executor()
        exe.run(startup)
        before = np.array(fleet.global_scope()["dtable"])
        names = fleet.load_persistables(exe, str(dirname), main_program=main)
        assert {"dtable", "dtable_moment1_0", "w", "emb_moment2_0"} <= set(names)
        dtable = fleet.global_scope()["dtable"]
        order = np.argsort(saved["dtable@ids"])
        np.testing.assert_array_equal(dtable[ids], saved["dtable@values"][order])
        untouched = [i for i in range(10) if i not in ids]
        np.testing.assert_array_equal(dtable[untouched], before[untouched])
        np.testing.assert_array_equal(fleet.global_scope()["w"], saved["w"])
    fw.reset_default_programs()


def test_an_id_outside_the_local_table_is_an_error_naming_it(tmp_path, monkeypatch):
    import fleet.base
    from role_makers import LocalRoleMaker

    cluster = _cluster(2)
    _train(cluster, steps=1)  # ids up to 2**63 - 1
    dirname, _ = _save(cluster, tmp_path / "dist")
    monkeypatch.setattr(fleet.base, "fleet", fleet.base.Fleet())
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        fleet.init(LocalRoleMaker())
        main, startup = _program()
        exe = fleet.Executor()
        exe.run(startup)
        with pytest.raises(ConfigError, match=r"table 'dtable' holds id -?\d+, outside the local table's "
                                              r"\[0, 10\); enlarge the embedding's size\[0\] to load it"):
            fleet.load_persistables(exe, dirname, main_program=main)
    fw.reset_default_programs()


def test_loading_names_a_missing_variable_a_wrong_shape_and_a_damaged_file(tmp_path):
    sgd = _cluster(2, opt="sgd")
    dirname, _ = _save(sgd, tmp_path / "sgd")
    with pytest.raises(ConfigError, match=r"checkpoint '.*sgd' has no '\w+_moment1_0', which this server needs; "
                                          r"it was saved from another model or with another optimizer"):
        _cluster(2, dirname, opt="adam")
    saved = fio.read_vars(dirname)
    saved["w"] = np.zeros((15, 1799), np.float32)
    fio.write_vars(str(tmp_path / "shape"), saved)
    with pytest.raises(ConfigError, match=r"'w' is saved with shape \[15, 1799\] but this program's is "
                                          r"\[15, 1800\]; load a checkpoint of the same model"):
        _cluster(2, str(tmp_path / "shape"), opt="sgd")
    path = tmp_path / "sgd" / fio.read_manifest(dirname)["vars"]["emb"]["file"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"does not match its manifest entry for 'emb' \(corrupt or altered save\)"):
        _cluster(2, dirname, opt="sgd")


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "rmsprop", "ftrl", "lamb", "decayed_adagrad", "adadelta",
                                 "adamax"])
def test_other_optimizers_round_trip_too(tmp_path, opt):
    first = _cluster(2, opt=opt)
    _train(first)
    dirname, _ = _save(first, tmp_path / "a")
    again = fio.read_vars(_save(_cluster(3, dirname, opt=opt), tmp_path / "b")[0])
    saved = fio.read_vars(dirname)
    rule = first.servers[first.plan.server_endpoints[0]].shards["dtable"][1].rule
    keys = tuple(rule.row_state_names)
    _assert_tables_equal(_table(again, keys=keys), _table(saved, keys=keys))
    whole = [n for n in saved if not n.startswith("dtable") and not n.endswith(("@blocks", "@block_offsets"))]
    assert {f"emb_{k}_0" for k in rule.state_names} <= set(whole)  # row and scalar state of the table
    for name in whole:
        np.testing.assert_array_equal(again[name], saved[name], err_msg=name)


# ------------------------------------------------------------------ the server ops
def test_state_reads_refuse_malformed_requests_with_the_reason():
    cluster = _cluster(1)
    client = next(iter(cluster.clients.values()))
    with pytest.raises(ServerError, match="pull_state needs meta 'items'"):
        client.request("pull_state", meta={"items": "w"})
    with pytest.raises(ServerError, match=r"pull_state item \['w', 0\] is not \[block name, first row, end row\]"):
        client.request("pull_state", meta={"items": [["w", 0]]})
    with pytest.raises(ServerError, match=r"dense table 'w': rows \[10, 99\) are not within \[0, 15\)"):
        client.request("pull_state", meta={"items": [["w", 10, 99]]})
    with pytest.raises(ServerError, match="holds no distributed table 'w'"):
        client.request("pull_shard", meta={"table": "w", "rows": 4})
    with pytest.raises(ServerError, match=r"pull_shard needs meta 'rows' \(an int >= 1\); got None"):
        client.request("pull_shard", meta={"table": "dtable"})
    with pytest.raises(ServerError, match=r"no read of table 'dtable' by worker 0 is in progress \(cursor 5\)"):
        client.request("pull_shard", meta={"table": "dtable", "cursor": 5})


def test_a_new_read_of_a_table_replaces_an_unfinished_one():
    cluster = _cluster(1)
    _train(cluster, steps=2)
    client = next(iter(cluster.clients.values()))
    first = client.request("pull_shard", meta={"table": "dtable", "rows": 2})
    assert not first.meta["done"]
    second = client.request("pull_shard", meta={"table": "dtable", "rows": 50})
    assert second.meta["done"] and len(second["ids"]) == second.meta["total"]
    with pytest.raises(ServerError, match="no read of table 'dtable' by worker 0 is in progress"):
        client.request("pull_shard", meta={"table": "dtable", "cursor": first.meta["cursor"]})


def test_a_table_read_covers_the_rows_that_existed_when_it_began():
    from fleet.rules import AdamRule

    table = SparseTable("t", 2, AdamRule(), ("uniform", -1.0, 1.0), seed=3)
    table.pull(np.arange(10))
    cursor = ShardCursor(table, 4)
    chunks = [cursor.next_chunk()]
    table.pull(np.arange(100, 120))  # rows created while the read goes on
    while not chunks[-1][1]:
        chunks.append(cursor.next_chunk())
    ids = np.concatenate([c["ids"] for c, _ in chunks])
    np.testing.assert_array_equal(ids, np.arange(10))
    assert all(c["state.beta1_pow"].shape == (1,) for c, _ in chunks)


def test_servers_report_the_checkpoint_they_loaded_and_a_worker_refuses_a_mix(tmp_path):
    from fleet.runtime import WorkerRuntime

    first = _cluster(2)
    with fio.VarsWriter(str(tmp_path / "ckpt"), {"save_id": "abc", "step": 40, "epoch": 2}) as writer:
        write_server_params(writer, first.comm, first.plan.params.values())
    fresh = _cluster(2)
    assert {ep: info["dirname"] for ep, info in fresh.comm.checkpoint_info().items()} == \
           {ep: None for ep in fresh.servers}
    loaded = _cluster(2, str(tmp_path / "ckpt"))
    runtime = WorkerRuntime.__new__(WorkerRuntime)  # only what checkpoint_info uses
    runtime.started, runtime.comm = True, loaded.comm
    assert runtime.checkpoint_info() == {"dirname": str(tmp_path / "ckpt"), "save_id": "abc", "step": 40,
                                         "epoch": 2}
    list(loaded.servers.values())[1].loaded = {"dirname": "/elsewhere", "save_id": "xyz", "step": 1,
                                               "epoch": 0}
    with pytest.raises(ConfigError, match=r"the servers loaded different checkpoints \(127.0.0.1:7100: .*ckpt, "
                                          r"127.0.0.1:7101: /elsewhere\); start every server with the same"):
        runtime.checkpoint_info()
