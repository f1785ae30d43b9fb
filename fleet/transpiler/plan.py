"""Placement of parameters on servers: blocks exactly as Paddle's ``slice_variable``.

A ``DistPlan`` says, for every trainable parameter, how it is split into blocks of whole
rows and which server holds each block; ``is_distributed`` tables are not split but
sharded by ``id % server_num`` into hash tables. Workers and servers compute the same
plan from the same program and strategy, so they agree without talking. Under the hybrid
strategy only the tables (``is_sparse`` / ``is_distributed``) are in the plan: dense
parameters stay on the workers.
"""
import math
from dataclasses import dataclass, field

from fleet import schedules
from fleet.entries import CtrAccessorConfig
from fleet.errors import ConfigError
from fleet.framework.program import OPTIMIZE, Parameter

DENSE, SPARSE, DISTRIBUTED = "dense", "sparse", "distributed"


@dataclass(frozen=True)
class Block:
    """Rows [row_offset, row_offset + rows) of parameter ``param``, held by ``endpoint``."""

    param: str
    index: int
    row_offset: int
    rows: int
    width: int
    endpoint: str
    split: bool = True

    @property
    def name(self):
        return f"{self.param}.block{self.index}" if self.split else self.param

    def rows_of(self, full):
        """Returns the view of this block's rows in ``full``, the whole parameter (any rank:
        [rows, width] for a matrix or more, [rows] for a vector)."""
        view = full.reshape(full.shape[0], -1) if full.ndim > 1 else full.reshape(-1)
        return view[self.row_offset:self.row_offset + self.rows]


@dataclass
class ParamPlan:
    """One trainable parameter: shape, kind, blocks and its optimizer.

    ``learning_rate`` is the rate itself, or with a ``lr_schedule`` (a
    ``fleet.schedules`` spec) the parameter's multiplier of the schedule's rate.
    A distributed table may have ``entry`` (Paddle's attribute string of its admission
    entry) and ``accessor`` (the CTR accessor fields the strategy set for it, a dict);
    with either it keeps per-row statistics (``has_statistics``).
    """

    name: str
    shape: tuple
    kind: str  # DENSE, SPARSE (is_sparse table, row-range blocks) or DISTRIBUTED
    rule_type: str
    rule_attrs: dict
    learning_rate: float
    grad: str
    blocks: list = field(default_factory=list)
    init_spec: tuple = None
    seed: int = 0
    lr_schedule: dict = None
    entry: str = None
    accessor: dict = None

    @property
    def has_statistics(self):
        """True for a distributed table with an entry or an accessor config."""
        return self.kind == DISTRIBUTED and (self.entry is not None or self.accessor is not None)

    @property
    def width(self):
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def rows(self):
        return self.shape[0] if self.shape else 1

    def block_of_rows(self, rows):
        """Returns the block index of each row id (row-range routing of SPARSE tables)."""
        import numpy as np

        starts = np.array([b.row_offset for b in self.blocks], dtype=np.int64)
        return np.searchsorted(starts, rows, side="right") - 1


def slice_variable(shape, slice_count, min_block_size):
    """Splits a parameter into blocks as Paddle's ``slice_variable``.

    Returns:
        A list of element counts per block (each a whole number of rows for 2-D+).
    """
    numel = math.prod(shape) if shape else 1
    max_pservers = max(numel // min_block_size, 1)
    split_count = min(slice_count, max_pservers)
    block_size = int(math.ceil(numel / float(split_count)))
    if len(shape) >= 2:
        width = math.prod(shape[1:])
        remains = block_size % width
        if remains:
            block_size += width - remains
    split_count = int(math.ceil(numel / float(block_size)))
    return [min(block_size, numel - i * block_size) for i in range(split_count)]


@dataclass
class DistPlan:
    """The placement of every trainable parameter for one job. ``lr_begin``: the first
    value of the learning-rate step counter (servers count their own updates from it)."""

    mode: str
    server_endpoints: list
    worker_num: int
    params: dict  # name -> ParamPlan, in optimizer-op order
    lr_begin: int = 0

    def has_lr_schedule(self):
        """True if some parameter's rate is a schedule the servers evaluate."""
        return any(p.lr_schedule is not None for p in self.params.values())

    def blocks_on(self, endpoint):
        """Returns [(ParamPlan, Block)] that ``endpoint`` holds."""
        return [(p, b) for p in self.params.values() for b in p.blocks if b.endpoint == endpoint]

    def distributed_tables(self):
        return [p for p in self.params.values() if p.kind == DISTRIBUTED]

    def statistics_tables(self):
        """The distributed tables that keep per-row statistics (an entry or an accessor)."""
        return [p for p in self.params.values() if p.has_statistics]


def _optimizer_ops(program):
    return [op for op in program.global_block().ops if op.attr("op_role") == OPTIMIZE
            and op.input("Param")]


def _producer(block, name):
    """The last op writing ``name`` (a schedule's output is written once)."""
    found = None
    for op in block.ops:
        if name in op.output("Out"):
            found = op
    return found


def resolve_lr_schedule(block, name):
    """The ``fleet.schedules`` spec of learning-rate variable ``name`` (a nested spec
    where a schedule reads another's output), for servers to evaluate.

    Raises:
        ConfigError: ``name`` is not the output of a ``fleet.layers`` schedule (servers
            evaluate only those).
    """
    op = _producer(block, name)
    if op is None or op.type != "lr_schedule":
        made = f"op {op.type!r}" if op is not None else "no op"
        raise ConfigError(
            f"learning rate {name!r} is computed by {made}; in distributed training the servers evaluate "
            f"the rate themselves and know only fleet.layers schedules (exponential_decay, piecewise_decay, "
            f"...): pass the schedule's Variable to the optimizer directly")
    spec = dict(op.attr("spec"))
    if op.input("LearningRate"):
        spec["learning_rate"] = resolve_lr_schedule(block, op.input("LearningRate")[0])
    return spec


def _lr_begin(block):
    for op in block.ops:
        if op.type == "increment" and op.output("Out") == [schedules.COUNTER]:
            return int(op.attr("begin", 0))
    return 0


def table_accessor(strategy, table):
    """The CTR accessor fields ``strategy`` sets for distributed table ``table`` (a dict),
    or None."""
    get = getattr(strategy, "sparse_table_config", None)
    fields = get(table) if get is not None else None
    if fields is None:
        return None
    try:
        return CtrAccessorConfig.from_dict(fields).to_dict()
    except ConfigError as e:
        raise ConfigError(f"set_sparse_table_config for table {table!r}: {e}") from e


def check_table_configs(strategy, distributed):
    """Refuses accessor configs set for tables that are not distributed tables of the program.

    Raises:
        ConfigError: names the unknown table and the program's distributed tables.
    """
    names = getattr(strategy, "sparse_table_names", None)
    for name in names() if names is not None else ():
        if name not in distributed:
            raise ConfigError(
                f"set_sparse_table_config names table {name!r}, which is not a distributed table of this "
                f"program; its distributed tables are {sorted(distributed)} (sparse_embedding / embedding with "
                f"is_distributed=True): pass one of them, or table_name=None for every table")


def build_plan(program, strategy, server_endpoints, worker_num):
    """Computes the placement of ``program``'s trainable parameters.

    Args:
        program: the main program after the optimizer's ``minimize``.
        strategy: a DistributedStrategy (mode, program config).
        server_endpoints: "host:port" of every server, in server-index order.
        worker_num: number of workers.

    Raises:
        ConfigError: two distributed tables (Paddle allows one), GEO with a distributed
            table, no optimizer ops (minimize was not called), an entry on a table that
            is not distributed, or an accessor config for a table the program lacks.
    """
    config = strategy.get_program_config()
    if not server_endpoints:
        raise ConfigError("a distributed plan needs at least one server endpoint (PADDLE_PSERVERS_IP_PORT_LIST)")
    ops = _optimizer_ops(program)
    if not ops:
        raise ConfigError("the program has no optimizer ops: call distributed_optimizer(...).minimize(loss) first")
    block = program.global_block()
    slice_count = len(server_endpoints) if config.slice_var_up else 1
    min_block = config.min_block_size
    dispatcher = config.make_dispatcher(list(server_endpoints))
    params = {}
    distributed = []
    for op in ops:
        param = block.var(op.input("Param")[0])
        if not isinstance(param, Parameter):
            continue
        if param.is_distributed:
            kind = DISTRIBUTED
            distributed.append(param.name)
        elif param.is_sparse:
            kind = SPARSE
        else:
            kind = DENSE
        if kind == DENSE and strategy.mode == "hybrid":  # on every worker, all-reduced among them
            continue
        attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", "learning_rate", "is_test")}
        plan = ParamPlan(param.name, tuple(param.shape), kind, op.type, attrs,
                         float(op.attr("learning_rate")), op.input("Grad")[0])
        if op.input("LearningRate") and strategy.mode != "geo":  # GEO workers run their own optimizer
            plan.lr_schedule = resolve_lr_schedule(block, op.input("LearningRate")[0])
        if param.initializer is not None and hasattr(param.initializer, "spec"):
            try:
                plan.init_spec = param.initializer.spec(param.shape)
            except NotImplementedError:
                plan.init_spec = None
        plan.seed = program._paired.seed_for(param.name) if program._paired else 0
        if kind == DISTRIBUTED:
            plan.entry = getattr(param, "entry", None)
            plan.accessor = table_accessor(strategy, param.name)
        elif getattr(param, "entry", None):
            raise ConfigError(f"table {param.name!r} has entry {param.entry!r} but is not is_distributed: "
                              f"entries admit ids of tables kept on the servers; pass is_distributed=True")
        params[param.name] = plan
    if strategy.mode == "hybrid" and not params:
        raise ConfigError("HybridStrategy keeps the is_sparse / is_distributed tables on the servers, but this "
                          "program has none (every parameter is dense): use strategies.CollectiveStrategy() "
                          "without servers, or mark the embeddings is_sparse=True")
    check_table_configs(strategy, distributed)
    if len(distributed) > 1:
        raise ConfigError(f"all distributed lookup_table_ops should have only one table (got {distributed})")
    if distributed and strategy.mode == "geo":
        raise ConfigError(
            "GeoStrategy can not support large scale embeding now, please use fluid.layers.embedding "
            f"(table {distributed[0]!r} has is_distributed=True; use is_sparse=True with GEO)")
    # Dispatch blocks in parameter order (Paddle dispatches grads and params alike).
    dispatcher.reset()
    for plan in params.values():
        if plan.kind == DISTRIBUTED:
            if plan.init_spec is None:
                raise ConfigError(
                    f"distributed table {plan.name!r} needs an initializer with a known "
                    f"distribution (Constant, Uniform, Normal, TruncatedNormal, Xavier)")
            plan.blocks = [Block(plan.name, i, 0, 0, plan.width, ep, split=True)
                           for i, ep in enumerate(server_endpoints)]
            continue
        sizes = slice_variable(plan.shape, slice_count, min_block)
        width = plan.width
        split = len(sizes) > 1
        names = [f"{plan.name}.block{i}" if split else plan.name for i in range(len(sizes))]
        endpoints = dispatcher.dispatch(names)
        offset = 0
        for i, (size, ep) in enumerate(zip(sizes, endpoints)):
            rows = size // width
            plan.blocks.append(Block(plan.name, i, offset, rows, width, ep, split))
            offset += rows
    return DistPlan(strategy.mode, list(server_endpoints), int(worker_num), params, _lr_begin(block))
