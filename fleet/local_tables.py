"""Local training of tables that admit ids or keep statistics, as the servers do.

A distributed table (``sparse_embedding``, ``embedding(is_distributed=True)``) with an
entry (``fleet.CountFilterEntry`` ...) or a CTR accessor config (the strategy's
``set_sparse_table_config``, with ``fleet.distributed_optimizer`` in local training)
must behave locally as on the servers, so that local and distributed runs agree: the
same admission decisions, statistics and ``fleet.shrink()``. Locally such a table is
therefore not a dense array in the scope but an in-process ``fleet.tables.SparseTable``
built as a server builds its shard (same width, initializer spec, seed, update rule,
entry and accessor), reached through the path a worker's lookups take:

- the programs the executor runs are rewritten (``fleet.framework.hooks``'s local
  rewriter): each such table is read through a ``prefetch`` op (training lookups send
  the batch's shows and clicks and go through ``SparseTable.pull_train``; test programs
  read with ``pull(create=False)``), its optimizer op becomes a ``push_sparse_table`` op
  that applies the gradient rows with ``SparseTable.push`` (the same rule kernels as a
  server; rows not admitted are dropped), and the program's ``training_hooks`` is this
  module's ``LocalTables``;
- a startup program that initializes such a table resets it (a fresh, empty table) and no
  longer allocates the dense [size[0], width] array.

Hogwild threads push on their own; a Reduce build strategy pushes the threads' combined
gradient once per step (a split batch's parts pull separately, so an id that reaches its
count in the second part reads zeros in the first: the same admissions, but that step's
forward pass can differ from one thread's).

``local_tables()`` returns the tables ({name: SparseTable}), e.g. for saving them;
``local_tables(program)`` those ``program`` reads, created empty if needed (to load a save
into them after running the startup program, which resets them).
Thread-safe.
"""
import threading
import weakref

import numpy as np

from fleet.communicator import ops as _communicator_ops  # noqa: F401  (registers prefetch)
from fleet.communicator.statistics import unique_statistics
from fleet.entries import CtrAccessorConfig, entry_from_attr
from fleet.errors import ConfigError
from fleet.framework.hooks import TrainingHooks, set_local_rewriter
from fleet.framework.program import OPTIMIZE, Operator
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import PrefetchedRows, SparseRows
from fleet.rules import make_rule, rule_from_op_attrs
from fleet.tables.sparse_table import SparseTable
from fleet.transpiler.plan import check_table_configs, table_accessor
from fleet.transpiler.worker_program import insert_prefetches

PUSH_SPARSE_TABLE = "push_sparse_table"
_ANY_ID = 2 ** 63 - 1  # a local table, like a server's, takes any int64 id


class _TableSpec:
    """How to build one local table: what a server takes from the plan."""

    __slots__ = ("name", "dim", "rule", "init_spec", "seed", "entry", "accessor")

    def __init__(self, name, dim, rule, init_spec, seed, entry, accessor):
        self.name, self.dim, self.rule, self.init_spec = name, dim, rule, init_spec
        self.seed, self.entry, self.accessor = seed, entry, accessor

    def build(self):
        options = {}
        if self.entry:
            options["entry"] = entry_from_attr(self.entry)
        if self.accessor is not None:
            options["accessor"] = CtrAccessorConfig.from_dict(self.accessor)
        return SparseTable(self.name, self.dim, self.rule, self.init_spec, seed=self.seed, **options)


class LocalTables(TrainingHooks):
    """The local tables with an entry or accessor, and the training hooks their programs
    run with (``prefetch``, ``push_table``). One per process (``LOCAL``); thread-safe."""

    running = True
    mode = "local"

    def __init__(self):
        self._lock = threading.RLock()
        self._tables = {}  # name -> SparseTable
        self._specs = {}  # name -> _TableSpec (how to build it again after a reset)
        self._accessors = {}  # name -> accessor fields set by the strategy (local fleet.distributed_optimizer)
        self._rewritten = weakref.WeakKeyDictionary()  # program -> (its version, program to run)
        self._kinds = weakref.WeakKeyDictionary()  # program -> (its version, served tables, is a startup)

    # ------------------------------------------------------------------ configuration
    def configure(self, program, strategy):
        """Takes the accessor configs ``strategy`` sets for the distributed tables of
        ``program`` (local ``fleet.distributed_optimizer(...).minimize``); their tables
        start afresh.

        Raises:
            ConfigError: a config for a table the program does not have (names them).
        """
        tables = [p.name for p in program.all_parameters() if p.is_distributed]
        check_table_configs(strategy, tables)
        with self._lock:
            self._accessors = {}
            for name in tables:
                fields = table_accessor(strategy, name)
                if fields is not None:
                    self._accessors[name] = fields
                    self._tables.pop(name, None)
            self._rewritten = weakref.WeakKeyDictionary()
            self._kinds = weakref.WeakKeyDictionary()

    def served(self, program):
        """The names of ``program``'s distributed tables served here: those with an
        entry or an accessor config."""
        with self._lock:
            return sorted(p.name for p in program.all_parameters()
                          if p.is_distributed and (p.entry or p.name in self._accessors))

    def tables(self):
        """{name: SparseTable} of the tables created so far (a new dict of the live tables)."""
        with self._lock:
            return dict(self._tables)

    def tables_of(self, program):
        """{name: SparseTable} of the served tables ``program`` reads, created if needed
        (built as when the program runs)."""
        out = {}
        for name in self.served(program):
            if any(op.type == "lookup_table" and op.input("W") == [name] for op in program.global_block().ops):
                self._register(program, name)
                out[name] = self._table(name)
        return out

    def _table(self, name):
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                spec = self._specs.get(name)
                if spec is None:
                    raise ConfigError(f"local table {name!r} is not known here: run the program that reads it "
                                      f"with a fleet Executor")
                table = self._tables[name] = spec.build()
            return table

    # ------------------------------------------------------------------ programs
    def rewrite(self, program):
        """The program the executor runs for ``program`` (see the module docstring):
        ``program`` itself when it has no served table or belongs to a runtime
        (``training_hooks`` set). Cached per program and version."""
        if program.training_hooks is not None or program._is_distributed:
            return program
        with self._lock:
            kind = self._kinds.get(program)
            if kind is None or kind[0] != program._version:
                served = self._served_of(program)
                kind = self._kinds[program] = (program._version, served, bool(served) and _is_startup(program, served))
        _, served, startup = kind
        if not served:
            return program
        if startup:
            return self._rewrite_startup(program, served)
        with self._lock:
            cached = self._rewritten.get(program)
            if cached is not None and cached[0] == program._version:
                return cached[1]
            run = self._rewrite_main(program, served)
            self._rewritten[program] = (program._version, run)
            return run

    def _served_of(self, program):
        main = program if _reads_tables(program) else program._paired
        if main is None:
            return []
        return self.served(main)

    def _rewrite_startup(self, startup, served):
        """A startup program without the dense initializers of the served tables and of
        their optimizer states (the local tables keep those per row); running it resets
        the tables (called right before each run, so the reset happens here)."""
        with self._lock:
            for name in served:
                self._tables.pop(name, None)
            cached = self._rewritten.get(startup)
            if cached is not None and cached[0] == startup._version:
                return cached[1]
            owned = set(served) | _optimizer_states(startup._paired, served)
            run = startup.clone(for_test=False)
            block = run.global_block()
            block.ops[:] = [op for op in block.ops if not set(op.output_arg_names) & owned]
            for name in owned:
                block.vars.pop(name, None)
            run.training_hooks = self
            self._rewritten[startup] = (startup._version, run)
            return run

    def _rewrite_main(self, program, served):
        run = program.clone(for_test=False)
        run._is_test = program._is_test
        block = run.global_block()
        reads = [name for name in served if any(op.type == "lookup_table" and op.input("W") == [name]
                                                for op in block.ops)]
        for name in reads:
            self._register(program, name)
        kept = []
        for op in block.ops:
            param = op.input("Param")
            if op.attr("op_role") == OPTIMIZE and param and param[0] in reads:
                self._register(program, param[0], op)
                inputs = {"Grad": op.input("Grad")}
                if op.input("LearningRate"):
                    inputs["LearningRate"] = op.input("LearningRate")
                kept.append(Operator(block, PUSH_SPARSE_TABLE, inputs, {},
                                     {"table": param[0], "learning_rate": op.attr("learning_rate"),
                                      "op_role": OPTIMIZE}))
                continue
            kept.append(op)
        block.ops[:] = kept
        insert_prefetches(block, set(reads), is_test=program._is_test)
        for name in reads:  # the values live in the local table, not in the scope
            block.vars[name].persistable = False
        run.training_hooks = self
        run._bump()
        return run

    def _register(self, program, name, optimizer_op=None):
        """Records how to build table ``name`` (as a server would from the plan); with
        the optimizer op its rule, else the rule of the program's training counterpart."""
        param = program.global_block().vars[name]
        op = optimizer_op or _optimizer_op_of(program, name)
        with self._lock:
            known = self._specs.get(name)
            if known is not None and op is None:
                rule = known.rule
            elif op is not None:
                attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", "learning_rate", "is_test")}
                rule = rule_from_op_attrs(op.type, attrs)
            else:
                rule = make_rule("sgd")
            spec = _TableSpec(name, _width(param), rule, _init_spec(param), _seed_of(program, name),
                              param.entry, self._accessors.get(name))
            if known is None or _differs(known, spec):
                self._specs[name] = spec
                self._tables.pop(name, None)

    # ------------------------------------------------------------------ hooks used by ops
    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        """Rows of a local table for a batch's ids: a training lookup admits and counts
        (``pull_train`` with the ids' shows and clicks), a test lookup creates nothing.

        Returns:
            PrefetchedRows of the sorted unique ids.
        """
        t = self._table(table)
        if is_test:
            uniq = np.unique(np.asarray(ids, dtype=np.int64))
            values = t.pull(uniq, create=False)
        else:
            uniq, shows, clicks = unique_statistics(ids, shows, clicks)
            values = t.pull_train(uniq, shows, clicks)
        return PrefetchedRows(table, uniq, values, _ANY_ID)

    def push_table(self, table, grad, lr):
        """Applies gradient rows to a local table (``SparseTable.push``: the rule's kernels;
        rows not admitted are dropped)."""
        if isinstance(grad, SparseRows):
            self._table(table).push(grad.rows, grad.values, lr)
        elif grad is not None:
            raise ConfigError(f"table {table!r} got a dense gradient; a distributed table's gradient is rows "
                              f"(SparseRows)")

    def shrink(self):
        """Shrinks every local table with statistics (``SparseTable.shrink``).

        Returns:
            {table: rows deleted}.

        Raises:
            ConfigError: no local table keeps statistics (names the fix).
        """
        with self._lock:
            names = [n for n in self._specs if self._specs[n].entry or self._specs[n].accessor is not None]
        if not names:
            raise ConfigError(
                "fleet.shrink() evicts rows of tables that keep statistics, and this process has none: give a "
                "sparse_embedding an entry (fleet.CountFilterEntry(...)) or set its accessor with "
                "strategy.set_sparse_table_config(...), and run a training program first")
        return {name: int(self._table(name).shrink()) for name in sorted(names)}

    def reset(self):
        """Forgets every table and spec (a new job in this process)."""
        with self._lock:
            self._tables.clear()
            self._specs.clear()
            self._accessors.clear()
            self._rewritten = weakref.WeakKeyDictionary()
            self._kinds = weakref.WeakKeyDictionary()


@register_op
class PushSparseTable(OpDef):
    """Applies a local table's gradient rows through the program's training hooks
    (``LocalTables.push_table``), at the optimizer op's rate (attr ``learning_rate``,
    times the LearningRate input when there is one)."""

    type = PUSH_SPARSE_TABLE

    def forward(self, ctx):
        hooks = ctx.op.block.program.training_hooks
        if not isinstance(hooks, LocalTables):
            raise ConfigError(f"{PUSH_SPARSE_TABLE} runs only in programs of fleet's local tables")
        lr = float(ctx.attrs["learning_rate"])
        if ctx.op.inputs.get("LearningRate"):
            lr *= float(np.asarray(ctx.input("LearningRate")).reshape(-1)[0])
        hooks.push_table(ctx.attrs["table"], ctx.input_opt("Grad"), lr)


def _reads_tables(program):
    return any(op.type == "lookup_table" for op in program.global_block().ops)


def _is_startup(program, served):
    return not _reads_tables(program) and any(set(op.output_arg_names) & set(served)
                                              for op in program.global_block().ops)


def _optimizer_states(main, tables):
    """The names of the optimizer-state variables of ``tables`` in ``main`` (moments,
    accumulators, beta powers: every input of their optimizer ops but Param, Grad and
    LearningRate)."""
    names = set()
    if main is None:
        return names
    for op in main.global_block().ops:
        if op.attr("op_role") == OPTIMIZE and op.input("Param") and op.input("Param")[0] in tables:
            names.update(n for slot, vs in op.inputs.items() if slot not in ("Param", "Grad", "LearningRate")
                         for n in vs)
    return names


def _optimizer_op_of(program, name):
    for candidate in (program, program._paired and program._paired._paired):
        if candidate is None:
            continue
        for op in candidate.global_block().ops:
            if op.attr("op_role") == OPTIMIZE and op.input("Param") == [name]:
                return op
    return None


def _width(param):
    return int(np.prod(param.shape[1:])) if len(param.shape) > 1 else 1


def _init_spec(param):
    init = getattr(param, "initializer", None)
    try:
        spec = init.spec(param.shape) if init is not None else None
    except NotImplementedError:
        spec = None
    if spec is None:
        raise ConfigError(f"table {param.name!r} needs an initializer with a known distribution (Constant, "
                          f"Uniform, Normal, TruncatedNormal, Xavier) to create its rows")
    return spec


def _seed_of(program, name):
    startup = program._paired
    return startup.seed_for(name) if startup is not None else 0


def _differs(a, b):
    """True when two specs build different tables (then the table starts afresh)."""
    return ((a.dim, a.init_spec, a.seed, a.entry, a.accessor, type(a.rule))
            != (b.dim, b.init_spec, b.seed, b.entry, b.accessor, type(b.rule)))


LOCAL = LocalTables()
"""The process's local tables."""

set_local_rewriter(LOCAL.rewrite)


def local_tables(program=None):
    """The local tables with an entry or accessor: {name: fleet.tables.SparseTable}, the
    live tables (each thread-safe).

    Args:
        program: None: the tables created so far (empty before a program reading one
            ran). A training program (or its test clone): the tables it reads, created
            empty now if they do not exist yet (e.g. to load a save into before training).

    Raises:
        ConfigError: a table of ``program`` without an initializer of known distribution.
    """
    if program is None:
        return LOCAL.tables()
    return LOCAL.tables_of(program)

