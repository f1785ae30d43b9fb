"""In-process parameter servers behind fake transport clients, for unit tests.

A ``FakeClient`` hands each request to a ``ParameterServer`` in the same process through
the real message encoding (``fleet.transport.message``), so requests and replies are
checked as on the wire (dtypes, unique names, FLEET_MAX_MESSAGE_BYTES), with no sockets.
Only requests answered inside ``handle`` are supported (no parked sync steps).
"""
import numpy as np

import fleet.framework as fw
from fleet.communicator.sync import SyncCommunicator
from fleet.errors import FleetError, ServerError
from fleet.framework import io as fio
from fleet.framework.save_chain import resolve_chain
from fleet.server.checkpoint import initial_values
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
from fleet.transport import message
from fleet.transport.server import Request


class _Outbox:
    """What a Request needs of its ServerSocket."""

    def __init__(self, max_message_bytes):
        self.max_message_bytes = max_message_bytes
        self.sent = []

    def _count(self, key, n=1):
        pass

    def _post(self, identity, frames):
        self.sent.append([bytes(f) for f in frames])


class FakeClient:
    """A transport Client whose server is a ParameterServer object in this process."""

    def __init__(self, server, worker_id=0, max_message_bytes=1 << 30):
        self.server = server
        self.endpoint = server.endpoint
        self.worker_id = worker_id
        self.max_message_bytes = max_message_bytes
        self.requests = []
        self._replies = {}
        self._seq = 0

    def send_request(self, op, names=(), arrays=(), meta=None, timeout_ms=None):
        self._seq += 1
        frames = message.encode(op, self._seq, self.worker_id, names, arrays, meta,
                                max_bytes=self.max_message_bytes)
        decoded = message.decode([bytes(f) for f in frames], self.max_message_bytes)
        outbox = _Outbox(self.max_message_bytes)
        req = Request(outbox, b"worker", decoded.header, decoded.arrays)
        try:
            self.server.handle(req)
        except FleetError as e:
            req.reply_error(str(e))
        assert req.answered, f"{op} was parked; FakeClient needs requests answered at once"
        self._replies[self._seq] = message.decode(outbox.sent[0], self.max_message_bytes, reply=True)
        self.requests.append(op)
        return self._seq

    def recv_reply(self, seq, timeout_ms=None):
        reply = self._replies.pop(seq)
        if not reply.header["ok"]:
            raise ServerError(self.endpoint, reply.header["error"])
        return reply

    def request(self, op, names=(), arrays=(), meta=None, timeout_ms=None):
        return self.recv_reply(self.send_request(op, names, arrays, meta, timeout_ms))

    def cancel(self, seq):
        self._replies.pop(seq, None)

    def close(self):
        pass


def endpoints(n):
    return [f"127.0.0.1:{7100 + i}" for i in range(n)]


def startup_values(startup):
    """{name: value} of everything the startup program initializes."""
    scope = fw.Scope()
    fw.Executor().run(startup, scope=scope)
    return {name: scope[name] for name in scope.keys()}


class Cluster:
    """n servers of ``main``'s plan (fresh from ``startup`` or loaded from ``dirname``, a
    save or the last save of a chain, as ``init_server`` loads it) and a worker
    communicator talking to them through FakeClients."""

    def __init__(self, main, startup, strategy, n, dirname=None, max_message_bytes=1 << 30, workers=1):
        self.plan = build_plan(main, strategy, endpoints(n), workers)
        self.servers = {}
        chain = resolve_chain(dirname) if dirname is not None else None
        reader = fio.VarsReader(chain[0]) if chain is not None else None
        fresh = startup_values(startup) if reader is None else None
        for ep in self.plan.server_endpoints:
            initial = fresh if reader is None else initial_values(reader, self.plan, ep)
            ps = ParameterServer(ep, self.plan, initial)
            if reader is not None:
                ps.load(reader, [fio.VarsReader(d) for d in chain[1:]])
            self.servers[ep] = ps
        self.clients = {}

        def connect(ep):
            self.clients[ep] = FakeClient(self.servers[ep], 0, max_message_bytes)
            return self.clients[ep]

        self.comm = SyncCommunicator(self.plan, 0, fw.Scope(), {}, connect)
        self.comm.start()

    def push(self, grads):
        """Applies {grad name: array or SparseRows} on the servers (async push)."""
        for ep, (names, arrays) in self.comm.split_grads(grads).items():
            if names:
                self.clients[ep].request("push", names, arrays)

    def whole(self):
        """{saved name: array} built from the servers' own state_dicts (not by the code
        under test): whole values and row state, per-block and per-server scalars, and
        each table as {id: (value, {key: row})}."""
        out, tables = {}, {}
        for ps in self.servers.values():
            for name, (pplan, block, table) in ps.blocks.items():
                state = table.state_dict()
                row_keys = {"value"} | {f"state.{k}" for k in table.rule.row_state_names}
                for key, arr in state.items():
                    target = pplan.name if key == "value" else f"{pplan.name}_{key[6:]}_0"
                    if key in row_keys:
                        full = out.setdefault(target, np.zeros(pplan.shape, arr.dtype))
                        block.rows_of(full)[...] = arr.reshape(block.rows_of(full).shape)
                    else:
                        out.setdefault(target + "@per_block", {})[block.index] = arr
            for name, (pplan, table) in ps.shards.items():
                state = table.state_dict()
                row_keys = {"values"} | {f"state.{k}" for k in table.rule.row_state_names}
                if getattr(table, "has_statistics", False):
                    state["stats"] = table.statistics(state["ids"])
                    row_keys.add("stats")
                for key in set(state) - row_keys - {"ids"}:  # scalar state, per server
                    out[f"{name}_{key[6:]}@{self.plan.server_endpoints.index(ps.endpoint)}"] = state[key]
                rows = tables.setdefault(name, {})
                for i, row_id in enumerate(state["ids"]):
                    rows[int(row_id)] = {k: state[k][i] for k in row_keys}
        return out, tables
