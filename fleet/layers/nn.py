"""fc, embedding, concat, sequence_pool and shape layers."""
import math

from fleet.entries import CountFilterEntry, ProbabilityEntry, ShowClickEntry
from fleet.errors import ConfigError
from fleet.framework.program import normalize_dtype
from fleet.layers.activation import apply_act, check_act
from fleet.layers.helper import append_op, check_var, create_tmp, layer_name
from fleet.layers.helper import create_parameter as _new_parameter
from fleet.param_attr import ParamAttr

_FUSED_ACTS = (None, "relu", "sigmoid", "tanh", "softmax")  # computed inside the fc op


def fc(input, size, num_flatten_dims=1, param_attr=None, bias_attr=None, act=None, name=None,
       is_test=False):
    """A fully connected layer: act(input @ W + b).

    Args:
        input: a Variable (or a list of them, each with its own weight, summed).
        size: output width.
        num_flatten_dims: leading dims kept; the rest are flattened into the width.
        param_attr / bias_attr: ParamAttr, name, or (bias_attr only) False for no bias.
        act: None or an activation of ``fleet.layers.activation.ACTS`` ("relu",
            "sigmoid", "tanh", "softmax", "square", "leaky_relu", ...).
        name: prefix of the parameters' names (default "fc_<n>"): name="tower" gives
            "tower.w_0" and "tower.b_0", as Paddle.

    Returns:
        The output Variable [batch, size]; on a lod_level=1 input one row per id, with its
        LoD.

    Raises:
        ConfigError: an unknown act, a size that is not a positive int, or input dims after
            ``num_flatten_dims`` that are not known.
    """
    check_act(act, "fc")
    if not isinstance(size, int) or size <= 0:
        raise ConfigError(f"fc size={size!r} must be a positive int")
    inputs = input if isinstance(input, (list, tuple)) else [input]
    layer = layer_name("fc", name)
    fused_act, act = (act, None) if act in _FUSED_ACTS else (None, act)
    param_attrs = param_attr if isinstance(param_attr, (list, tuple)) else [param_attr] * len(inputs)
    bias = None
    if bias_attr is not False:
        bias = _new_parameter(layer, bias_attr, [size], suffix="b", is_bias=True)
    if len(inputs) == 1:
        x = check_var(inputs[0], "input", "fc")
        w = _fc_weight(layer, x, size, num_flatten_dims, param_attrs[0])
        out = create_tmp(layer, _fc_out_shape(x, num_flatten_dims, size))
        append_op("fc", {"Input": x, "W": w, "Bias": bias}, {"Out": out},
                  {"act": fused_act, "in_num_col_dims": num_flatten_dims})
        return apply_act(out, act, "fc")
    partial = []
    for x, attr in zip(inputs, param_attrs):
        check_var(x, "input", "fc")
        w = _fc_weight(layer, x, size, num_flatten_dims, attr)
        part = create_tmp(layer, _fc_out_shape(x, num_flatten_dims, size))
        append_op("fc", {"Input": x, "W": w}, {"Out": part}, {"act": None, "in_num_col_dims": num_flatten_dims})
        partial.append(part)
    total = create_tmp(layer, partial[0].shape)
    append_op("sum", {"X": partial}, {"Out": total})
    if bias is not None:
        biased = create_tmp(layer, total.shape)
        append_op("elementwise_add", {"X": total, "Y": bias}, {"Out": biased},
                  {"axis": num_flatten_dims})
        total = biased
    return apply_act(total, fused_act or act, "fc")


def _fc_out_shape(x, num_flatten_dims, size):
    """Paddle's fc output shape: the first ``num_flatten_dims`` dims of x, then ``size``."""
    return tuple(x.shape[:num_flatten_dims]) + (size,) if x.shape else (-1, size)


def _fc_weight(layer, x, size, num_flatten_dims, attr):
    tail = x.shape[num_flatten_dims:]
    if not tail or any(d < 0 for d in tail):
        raise ConfigError(
            f"fc input {x.name!r} has shape {list(x.shape)}; the dims after num_flatten_dims="
            f"{num_flatten_dims} must be known (got {list(tail)})")
    return _new_parameter(layer, attr, [math.prod(tail), size])


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, dtype="float32", entry=None):
    """Looks up rows of a table [size[0], size[1]] for int64 ids.

    Args:
        input: int64 ids, lod_level=1 (sequences) or [batch, 1].
        size: [rows, width] of the table.
        is_sparse: the table's gradient is sent as SparseRows (only touched rows).
        is_distributed: in distributed training the table lives only on the servers,
            keyed by any int64 id; locally it behaves like is_sparse.
        padding_idx: an id whose rows are zero and get no gradient (negative counts
            from the end).
        param_attr: the table's ParamAttr or name; layers with the same name share it.
        entry: admission of new ids (``fleet.CountFilterEntry``, ``fleet.ProbabilityEntry``
            or ``fleet.ShowClickEntry``) for an ``is_distributed`` table; see
            ``sparse_embedding``.

    Returns:
        A Variable [.., width] (lod_level as the input).

    Raises:
        ConfigError: ids not int64, a bad size or padding_idx, an entry on a table that is
            not is_distributed, or an entry that is not one of the three.
    """
    check_var(input, "input", "embedding")
    if entry is not None and not is_distributed:
        raise ConfigError(
            f"embedding entry={entry!r} admits ids of a table kept on the servers, but this table is not "
            f"is_distributed: pass is_distributed=True (or use fleet.layers.sparse_embedding)")
    return _lookup(input, size, bool(is_sparse or is_distributed), bool(is_distributed), padding_idx,
                   param_attr, dtype, "embedding", _entry_attr(entry, input.block))


def sparse_embedding(input, size, padding_idx=None, is_test=False, entry=None,
                     table_class="MemorySparseTable", param_attr=None, dtype="float32", slot=None):
    """Looks up rows of a large sparse table kept on the parameter servers (Paddle 2.x's
    ``paddle.static.nn.sparse_embedding``): an ``is_distributed`` table keyed by any int64
    id, with rows created on first use.

    Args:
        input: int64 ids, lod_level=1 (sequences) or [batch, 1].
        size: [vocab, width]; only the width matters for the servers' table (any id is
            accepted); in local training without an entry the table has size[0] rows.
        padding_idx: an id whose rows are zero and get no gradient (negative counts from
            the end), or None.
        is_test: lookups only: unseen ids read as zero rows and nothing is created or
            counted.
        entry: admission of new ids, or None (every id gets a row on first sight):
            ``fleet.CountFilterEntry(n)``, ``fleet.ProbabilityEntry(p)`` or
            ``fleet.ShowClickEntry(show_name, click_name)`` (the names of two [batch, 1]
            inputs of this program, declared before this call). An id not admitted reads
            as zeros and its gradient is dropped. Locally such a table is served by an
            in-process ``fleet.tables.SparseTable`` (``fleet.runtime.local_tables()``),
            so local training admits as the servers do.
        table_class: "MemorySparseTable" (Paddle 2.x's names "CommonSparseTable" and
            "SSDSparseTable" are accepted and mean the same in-memory table).
        param_attr: the table's ParamAttr or name (its initializer initializes new rows).
        dtype: "float32".
        slot: Paddle's feature slot id (an int kept on the op; unused by fleet).

    Returns:
        A Variable [.., width] (lod_level as the input).

    Raises:
        ConfigError: a table_class, dtype or entry Paddle refuses, a ShowClickEntry whose
            show or click input is not in the program, or a bad size / padding_idx.
    """
    if table_class not in _TABLE_CLASSES:
        raise ConfigError(f"sparse_embedding table_class={table_class!r}: table_class must be in "
                          f"[{', '.join(_TABLE_CLASSES)}]")
    if normalize_dtype(dtype) != "float32":
        raise ConfigError(f"sparse_embedding dtype={dtype!r}: fleet's sparse tables hold float32 rows; "
                          f"pass dtype='float32'")
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or slot < 0):
        raise ConfigError(f"sparse_embedding slot={slot!r} must be a non-negative int or None")
    check_var(input, "input", "sparse_embedding")
    attrs = {"is_test": bool(is_test), "table_class": table_class, "slot": int(slot or 0),
             "remote_prefetch": True}
    return _lookup(input, size, True, True, padding_idx, param_attr, dtype, "sparse_embedding",
                   _entry_attr(entry, input.block), attrs)


_TABLE_CLASSES = ("MemorySparseTable", "CommonSparseTable", "SSDSparseTable")


def _entry_attr(entry, block):
    """Paddle's attribute string of ``entry`` ("none" for None), its inputs checked.

    Raises:
        ConfigError: not one of the three entries, or a ShowClickEntry input that is not
            a variable of ``block``.
    """
    if entry is None:
        return "none"
    if not isinstance(entry, (CountFilterEntry, ProbabilityEntry, ShowClickEntry)):
        raise ConfigError(
            f"entry={entry!r}: entry must be instance in [fleet.ProbabilityEntry, fleet.CountFilterEntry, "
            f"fleet.ShowClickEntry] (Paddle's paddle.distributed entries)")
    if isinstance(entry, ShowClickEntry):
        for what, name in (("show", entry.show_name), ("click", entry.click_name)):
            if not block.has_var(name):
                raise ConfigError(
                    f"ShowClickEntry {what} input {name!r} is not a variable of this program: declare it "
                    f"(fleet.layers.data({name!r}, shape=[1], dtype='float32')) before the embedding that "
                    f"uses the entry, and feed it with every training batch")
    return entry._to_attr()


def _lookup(input, size, is_sparse, is_distributed, padding_idx, param_attr, dtype, layer, entry="none",
            extra_attrs=None):
    check_var(input, "input", layer)
    if input.dtype != "int64":
        raise ConfigError(f"{layer} input {input.name!r} must be int64 ids, got {input.dtype}")
    if (not isinstance(size, (list, tuple)) or len(size) != 2
            or not all(isinstance(d, int) and d > 0 for d in size)):
        raise ConfigError(f"{layer} size={size!r} must be [rows, width] of positive ints")
    if padding_idx is not None and not -size[0] <= padding_idx < size[0]:
        raise ConfigError(f"{layer} padding_idx={padding_idx} must be in [{-size[0]}, {size[0]})")
    flags = {"is_sparse": is_sparse, "is_distributed": is_distributed}
    table = _new_parameter("embedding", param_attr, list(size), dtype, suffix="w", **flags)
    if entry != "none":
        if table.entry not in (None, entry):
            raise ConfigError(f"table {table.name!r} is shared with entry {table.entry!r} but requested with "
                              f"{entry!r}: give every lookup of a shared table the same entry")
        table.entry = entry
    lead = input.shape[:-1] if len(input.shape) > 1 and input.shape[-1] == 1 else input.shape
    out = create_tmp(layer, tuple(lead) + (size[1],), lod_level=input.lod_level)
    pad = -1 if padding_idx is None else (padding_idx + size[0] if padding_idx < 0 else padding_idx)
    attrs = dict(flags, padding_idx=pad)
    if entry != "none" or extra_attrs:
        attrs["entry"] = entry
    attrs.update(extra_attrs or {})
    append_op("lookup_table", {"Ids": input, "W": table}, {"Out": out}, attrs)
    return out


_POOLS = ("SUM", "AVERAGE", "MAX", "SQRT", "FIRST", "LAST")


def sequence_pool(input, pool_type, is_test=False, pad_value=0.0):
    """Pools each sequence of a lod_level=1 input to one row.

    Args:
        pool_type: "sum", "average", "max", "sqrt", "first" or "last".

    Returns:
        A Variable [batch, width]; empty sequences give zero rows.
    """
    check_var(input, "input", "sequence_pool")
    pool = str(pool_type).upper()
    if pool not in _POOLS:
        raise ConfigError(f"sequence_pool pool_type={pool_type!r}; use one of {[p.lower() for p in _POOLS]}")
    if input.lod_level != 1:
        raise ConfigError(f"sequence_pool input {input.name!r} must have lod_level=1")
    width = input.shape[-1] if len(input.shape) > 1 else 1
    out = create_tmp("sequence_pool", (-1, width))
    outputs = {"Out": out}
    if pool == "MAX":
        outputs["MaxIndex"] = create_tmp("sequence_pool", (-1, width), dtype="int64", stop_gradient=True)
    append_op("sequence_pool", {"X": input}, outputs, {"pooltype": pool, "is_test": is_test})
    return out


def concat(input, axis=0, name=None):
    """Concatenates variables along ``axis``."""
    if not isinstance(input, (list, tuple)) or not input:
        raise ConfigError("concat input must be a non-empty list of Variables")
    for x in input:
        check_var(x, "input", "concat")
    out = create_tmp(name or "concat", input[0].shape, input[0].dtype)
    append_op("concat", {"X": list(input)}, {"Out": out}, {"axis": axis})
    return out


def reshape(x, shape, actual_shape=None, act=None, inplace=False, name=None):
    """Reshapes x (a 0 keeps the input's dim, one -1 is inferred).

    On a lod_level=1 input the rows (one per id) must stay rows: the first dim 0 or -1.

    Raises:
        ConfigError: ``actual_shape`` (a Variable) is given, or an unknown ``act``.
    """
    check_var(x, "x", "reshape")
    if actual_shape is not None:
        raise ConfigError("reshape actual_shape (a shape computed at run time) is not supported; "
                          "pass the shape as a list with 0 and -1")
    shape = [int(d) for d in shape]
    if shape.count(-1) > 1:
        raise ConfigError(f"reshape shape={shape} has more than one -1; only one dim can be inferred")
    shown = tuple(x.shape[i] if d == 0 else d for i, d in enumerate(shape))
    out = create_tmp(name or "reshape", shown, x.dtype)
    append_op("reshape", {"X": x}, {"Out": out}, {"shape": shape})
    return apply_act(out, act, "reshape")


def scale(x, scale=1.0, bias=0.0, bias_after_scale=True, act=None, name=None):
    """x * scale + bias."""
    check_var(x, "x", "scale")
    out = create_tmp(name or "scale", x.shape, x.dtype, x.lod_level)
    append_op("scale", {"X": x}, {"Out": out},
              {"scale": float(scale), "bias": float(bias), "bias_after_scale": bias_after_scale})
    return apply_act(out, act, "scale")


def cast(x, dtype):
    """Converts to ``dtype`` (no gradient)."""
    check_var(x, "x", "cast")
    dtype = normalize_dtype(dtype)
    out = create_tmp("cast", x.shape, dtype, stop_gradient=True)
    append_op("cast", {"X": x}, {"Out": out}, {"out_dtype": dtype})
    return out


def fill_constant(shape, dtype, value, name=None):
    """A constant tensor computed at every run."""
    dtype = normalize_dtype(dtype)
    out = create_tmp(name or "fill_constant", tuple(shape), dtype, stop_gradient=True)
    append_op("fill_constant", {}, {"Out": out}, {"shape": list(shape), "dtype": dtype, "value": float(value)})
    return out


def create_parameter(shape, dtype="float32", name=None, attr=None, is_bias=False,
                     default_initializer=None):
    """Creates a free parameter (for custom layers built from the math layers)."""
    attr = ParamAttr.to_attr(attr)
    if name and not attr.name:
        attr.name = name
    return _new_parameter("create_parameter", attr, list(shape), dtype, default_initializer, is_bias=is_bias)
