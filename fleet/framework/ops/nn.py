"""Neural-network ops: fc, embedding lookup, sequence pooling and the losses."""
import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework import lod
from fleet.framework.ops.activation_ops import sigmoid_into, softmax_into
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import LoDTensor, PrefetchedRows, SparseRows
from fleet.kernels import embedding as emb
from fleet.kernels import sparse as sparse_kernels

POOL_TYPES = {"SUM": 0, "AVERAGE": 1, "MAX": 2, "SQRT": 3}


# ------------------------------------------------------------------------- fc
def _act_forward(act, out):
    if act == "relu":
        np.maximum(out, 0, out=out)
    elif act == "sigmoid":
        sigmoid_into(out, out)
    elif act == "tanh":
        np.tanh(out, out=out)
    elif act == "softmax":
        softmax_into(out, out)


def _act_backward(act, out, g, buf):
    """Returns d(pre-activation) from the activation's output and its gradient."""
    if not act:
        return g
    if act == "relu":
        np.multiply(g, out > 0, out=buf)
    elif act == "sigmoid":
        np.multiply(g, out * (1 - out), out=buf)
    elif act == "tanh":
        np.multiply(g, 1 - out * out, out=buf)
    elif act == "softmax":
        np.multiply(out, g - (g * out).sum(axis=-1, keepdims=True), out=buf)
    return buf


def _fc_lead(ctx, x):
    """The dims of ``x`` kept by fc (``in_num_col_dims`` of them); the rest are flattened."""
    return tuple(x.shape[: int(ctx.attrs.get("in_num_col_dims", 1))]) if x.ndim else ()


@register_op
class FC(OpDef):
    """Out = act(flatten(Input) @ W + Bias): Paddle's mul + elementwise_add + act, fused.
    On lod_level=1 values it works row by row (one output row per id) and keeps the LoD."""

    type = "fc"
    grad_slots = ("Input", "W", "Bias")
    lod = lod.ROWWISE

    def forward(self, ctx):
        x = ctx.input("Input")
        w = ctx.input("W")
        lead = _fc_lead(ctx, x)
        rows = int(np.prod(lead)) if lead else 1
        x2 = x.reshape(rows, w.shape[0])  # explicit width: -1 cannot be inferred for 0 rows
        out = ctx.buffer("Out", (rows, w.shape[1]))
        np.matmul(x2, w, out=out)
        b = ctx.input_opt("Bias")
        if b is not None:
            out += b
        _act_forward(ctx.attrs.get("act"), out)
        ctx.set_output("Out", out if len(lead) == 1 else out.reshape(lead + (w.shape[1],)))

    def backward(self, ctx):
        x = ctx.input("Input")
        w = ctx.input("W")
        width = w.shape[1]
        out = ctx.input("Out").reshape(-1, width)
        g = ctx.input("Out@GRAD").reshape(-1, width)
        act = ctx.attrs.get("act")
        dpre = _act_backward(act, out, g, ctx.buffer("Out@GRAD", out.shape) if act else None)
        x2 = x.reshape(out.shape[0], w.shape[0])
        if ctx.wants("W@GRAD"):
            dw = ctx.buffer("W@GRAD", w.shape)
            np.matmul(x2.T, dpre, out=dw)
            ctx.set_output("W@GRAD", dw)
        if ctx.wants("Bias@GRAD"):
            ctx.set_output("Bias@GRAD", dpre.sum(axis=0))
        if ctx.wants("Input@GRAD"):
            dx = ctx.buffer("Input@GRAD", x2.shape)
            np.matmul(dpre, w.T, out=dx)
            ctx.set_output("Input@GRAD", dx.reshape(x.shape))


# ------------------------------------------------------------------------- embeddings
def _ids_of(ctx, ids):
    """Returns (flat int64 ids, offsets or None, shape of the dense ids)."""
    if isinstance(ids, LoDTensor):
        return ids.values, ids.offsets, None
    flat = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    return flat, None, ids.shape


def _check_ids(ctx, flat, height, starts=None):
    bad = emb.check_ids(flat, height)
    if bad >= 0:
        w_name = ctx.input_name("W")
        slot = 0 if starts is None else int(np.searchsorted(starts, bad, side="right")) - 1
        raise DataError(
            f"embedding {w_name!r} has {height} rows but got id {int(flat[bad])} "
            f"(input {ctx.input_name('Ids', slot)!r}); ids must be in [0, {height}): hash them into "
            f"the table size or enlarge size[0]"
        )


def _table_and_ids(ctx, w, flat, starts=None):
    """Returns (array to gather from, ids into it, padding index into it).

    Locally that is the table itself. On a distributed worker ``w`` holds the rows
    prefetched for this batch; ids are mapped to positions among them, and so is the
    padding id (which is fetched like any other id, then zeroed by the kernel).
    """
    if isinstance(w, PrefetchedRows):
        pad = _padding(ctx, w.height)
        if pad >= 0:
            pos = int(np.searchsorted(w.ids, pad))
            pad = pos if pos < len(w.ids) and w.ids[pos] == pad else -1
        return w.values, w.local(flat), pad
    entry = ctx.attrs.get("entry")
    if entry not in (None, "none") and not ctx.attrs.get("is_test") and not ctx.op.block.program._is_test:
        raise ConfigError(
            f"table {ctx.input_name('W')!r} has entry {entry!r}, so its training lookups must go through a "
            f"sparse table that admits ids (the servers', or fleet's local tables), not a plain array: "
            f"import fleet and run the program with a fleet Executor (fleet.Executor()), which serves such "
            f"tables locally")
    _check_ids(ctx, flat, w.shape[0], starts)
    return w, flat, _padding(ctx, w.shape[0])


def _padding(ctx, height):
    p = ctx.attrs.get("padding_idx", -1)
    if p is None:
        return -1
    return p + height if p < 0 and p != -1 else p


@register_op
class LookupTable(OpDef):
    """Out[i] = W[Ids[i]]; the gradient of W is SparseRows when ``is_sparse``."""

    type = "lookup_table"
    grad_slots = ("W",)
    lod = lod.SEQUENCE

    def forward(self, ctx):
        w = ctx.input("W")
        ids = ctx.input("Ids")
        flat, offsets, shape = _ids_of(ctx, ids)
        table, local, pad = _table_and_ids(ctx, w, flat)
        out = np.empty((len(flat), w.shape[1]), dtype=np.float32)
        emb.gather_rows(table, local, pad, out)
        if offsets is not None:
            ctx.set_output("Out", LoDTensor(out, offsets))
        else:
            lead = shape[:-1] if len(shape) > 1 and shape[-1] == 1 else shape
            ctx.set_output("Out", out.reshape(tuple(lead) + (w.shape[1],)))

    def backward(self, ctx):
        w = ctx.input("W")
        flat, _, _ = _ids_of(ctx, ctx.input("Ids"))
        g = ctx.input("Out@GRAD")
        values = np.array(g.values if isinstance(g, LoDTensor) else g, dtype=np.float32).reshape(len(flat), w.shape[1])
        pad = _padding(ctx, w.shape[0])
        if pad >= 0:
            values[flat == pad] = 0
        ctx.set_output("W@GRAD", _table_grad(ctx, w, flat.copy(), values))


def _table_grad(ctx, w, rows, values):
    if ctx.attrs.get("is_sparse") or ctx.attrs.get("is_distributed"):
        return SparseRows(rows, values, w.shape[0])
    dense = np.zeros(w.shape, dtype=np.float32)
    sparse_kernels.scatter_add(dense, rows, values)
    return dense


def _seq_arange(ctx, total):
    cache = ctx.local.get("@arange")
    if cache is None or len(cache) < total:
        cache = np.arange(max(total, 1024), dtype=np.int64)
        ctx.local["@arange"] = cache
    return cache[:total]


@register_op
class SequencePool(OpDef):
    """Pools each sequence of a lod input to one row: SUM, AVERAGE, MAX, SQRT, FIRST, LAST."""

    type = "sequence_pool"
    grad_slots = ("X",)
    lod = lod.SEQUENCE

    def forward(self, ctx):
        x = ctx.input("X")
        if not isinstance(x, LoDTensor):
            raise DataError(f"sequence_pool input {ctx.input_name('X')!r} must be a lod_level=1 value")
        pool = ctx.attrs["pooltype"]
        values = x.values.reshape(len(x.values), -1)
        batch, width = x.batch_size, values.shape[1]
        out = ctx.buffer("Out", (batch, width))
        if pool in ("FIRST", "LAST"):
            lengths = np.diff(x.offsets)
            idx = x.offsets[:-1] if pool == "FIRST" else x.offsets[1:] - 1
            out[:] = 0
            nonempty = lengths > 0
            out[nonempty] = values[idx[nonempty]]
        else:
            argmax = np.empty((batch, width), dtype=np.int64) if pool == "MAX" else _dummy_argmax()
            ids = _seq_arange(ctx, len(values))
            emb.gather_pool(np.ascontiguousarray(values, dtype=np.float32), ids, x.offsets,
                            POOL_TYPES[pool], -1, out, argmax)
            if pool == "MAX":
                ctx.set_output("MaxIndex", argmax)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        x = ctx.input("X")
        g = ctx.input("Out@GRAD")
        pool = ctx.attrs["pooltype"]
        values = x.values.reshape(len(x.values), -1)
        dx = np.zeros(values.shape, dtype=np.float32)
        if pool in ("FIRST", "LAST"):
            lengths = np.diff(x.offsets)
            idx = x.offsets[:-1] if pool == "FIRST" else x.offsets[1:] - 1
            nonempty = lengths > 0
            dx[idx[nonempty]] = g[nonempty]
        else:
            argmax = ctx.input("MaxIndex") if pool == "MAX" else _dummy_argmax()
            emb.gather_pool_grad(np.ascontiguousarray(g, dtype=np.float32), _seq_arange(ctx, len(values)),
                                 x.offsets, POOL_TYPES[pool], -1, argmax, dx)
        ctx.set_output("X@GRAD", LoDTensor(dx.reshape(x.values.shape), x.offsets))


_DUMMY = np.zeros((1, 1), dtype=np.int64)


def _dummy_argmax():
    return _DUMMY


@register_op
class FusedEmbeddingSeqPool(OpDef):
    """lookup_table followed by sequence_pool, in one kernel (made by the execution pass)."""

    type = "fused_embedding_seq_pool"
    grad_slots = ("W",)
    lod = lod.SEQUENCE

    def forward(self, ctx):
        w = ctx.input("W")
        ids = ctx.input("Ids")
        if not isinstance(ids, LoDTensor):
            raise DataError(f"input {ctx.input_name('Ids')!r} must be a lod_level=1 value (ids per example)")
        table, local, pad = _table_and_ids(ctx, w, ids.values)
        pool = POOL_TYPES[ctx.attrs["pooltype"]]
        out = ctx.buffer("Out", (ids.batch_size, w.shape[1]))
        argmax = np.empty(out.shape, dtype=np.int64) if pool == 2 else _dummy_argmax()
        emb.gather_pool(table, local, ids.offsets, pool, pad, out, argmax)
        if pool == 2:
            ctx.set_output("MaxIndex", argmax)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        w = ctx.input("W")
        ids = ctx.input("Ids")
        g = ctx.input("Out@GRAD")
        pool = POOL_TYPES[ctx.attrs["pooltype"]]
        argmax = ctx.input("MaxIndex") if pool == 2 else _dummy_argmax()
        values = np.empty((len(ids.values), w.shape[1]), dtype=np.float32)
        emb.gather_pool_grad(g, ids.values, ids.offsets, pool, _padding(ctx, w.shape[0]), argmax, values)
        ctx.set_output("W@GRAD", _table_grad(ctx, w, ids.values.copy(), values))


@register_op
class FusedMultiEmbeddingSeqPool(OpDef):
    """Several fused_embedding_seq_pool ops of one table (sum, average or sqrt pool) in one
    kernel call (made by the execution pass). ``Ids`` and ``Out`` list the slots; the grad
    op writes one gradient of ``W``: every slot's rows, slot after slot in ``Ids`` order."""

    type = "fused_multi_embedding_seq_pool"
    grad_slots = ("W",)
    lod = lod.SEQUENCE

    def forward(self, ctx):
        w = ctx.input("W")
        flat, offsets, batches, starts = _join_slots(ctx, ctx.op.output("Out")[0])
        table, local, pad = _table_and_ids(ctx, w, flat, starts)
        key = "@multi_pool:" + ctx.output_name("Out")
        out = ctx.local.get(key)
        if out is None or out.shape != (len(offsets) - 1, w.shape[1]):
            out = ctx.local[key] = np.empty((len(offsets) - 1, w.shape[1]), dtype=np.float32)
        emb.gather_pool(table, local, offsets, POOL_TYPES[ctx.attrs["pooltype"]], pad, out, _dummy_argmax())
        row = 0
        for k, batch in enumerate(batches):
            ctx.set_output("Out", out[row:row + batch], k)
            row += batch

    def backward(self, ctx):
        w = ctx.input("W")
        flat, offsets, _, _ = _join_slots(ctx, ctx.op.input("Out")[0], last_use=True)
        grads = ctx.inputs("Out@GRAD")
        dout = grads[0] if len(grads) == 1 else np.concatenate(grads)
        values = np.empty((len(flat), w.shape[1]), dtype=np.float32)
        emb.gather_pool_grad(dout, flat, offsets, POOL_TYPES[ctx.attrs["pooltype"]],
                             _padding(ctx, w.shape[0]), _dummy_argmax(), values)
        # flat is this step's own array (a concatenation, no longer kept): not a copy
        ctx.set_output("W@GRAD", _table_grad(ctx, w, flat, values))


def _join_slots(ctx, out_name, last_use=False):
    """(every slot's ids in one array, one offsets array over all slots' examples, the
    slots' batch sizes, each slot's first position in the ids), slot after slot. The
    forward keeps its result for the grad op (``last_use``), which reads the same ids
    objects."""
    slots = ctx.inputs("Ids")
    key = "@multi_ids:" + out_name
    kept = ctx.local.pop(key, None) if last_use else None
    if kept is not None and len(kept[0]) == len(slots) and all(a is b for a, b in zip(kept[0], slots)):
        return kept[1]
    for k, ids in enumerate(slots):
        if not isinstance(ids, LoDTensor):
            raise DataError(f"input {ctx.input_name('Ids', k)!r} must be a lod_level=1 value (ids per example)")
    batches = [ids.batch_size for ids in slots]
    sizes = np.array([len(ids.values) for ids in slots], dtype=np.int64)
    starts = np.zeros(len(slots), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    flat = np.concatenate([ids.values for ids in slots])
    offsets = np.empty(sum(batches) + 1, dtype=np.int64)
    row = 0
    for ids, batch, start in zip(slots, batches, starts):
        np.add(ids.offsets[:-1], start, out=offsets[row:row + batch])
        row += batch
    offsets[row] = len(flat)
    joined = (flat, offsets, batches, starts)
    if not last_use:
        ctx.local[key] = (slots, joined)
    return joined


# ------------------------------------------------------------------------- losses
def _label_index(label, n, name="label"):
    lab = np.asarray(label).reshape(-1).astype(np.int64, copy=False)
    if len(lab) != n:
        raise DataError(f"label {name!r} has {len(lab)} entries for a batch of {n}; feed one "
                        f"label per example")
    return lab


@register_op
class CrossEntropy(OpDef):
    """Out[b] = -log(X[b, Label[b]]) for probabilities X (or soft labels)."""

    type = "cross_entropy"
    grad_slots = ("X",)
    EPS = np.float32(1e-20)

    def forward(self, ctx):
        x = ctx.input("X")
        label = ctx.input("Label")
        n = x.shape[0]
        if ctx.attrs.get("soft_label"):
            out = -(np.asarray(label, dtype=np.float32) * np.log(np.maximum(x, self.EPS))).sum(axis=-1, keepdims=True)
        else:
            lab = _label_index(label, n, ctx.input_name('Label'))
            bad = (lab < 0) | (lab >= x.shape[1])
            bad &= lab != ctx.attrs.get("ignore_index", -100)
            if bad.any():
                raise DataError(
                    f"cross_entropy label {ctx.input_name('Label')!r} values must be class ids in "
                    f"[0, {x.shape[1]}), got {int(lab[bad][0])}; feed ids below the number of "
                    f"classes (or ignore_index)")
            p = x[np.arange(n), np.clip(lab, 0, x.shape[1] - 1)]
            out = -np.log(np.maximum(p, self.EPS)).reshape(n, 1)
            ignore = lab == ctx.attrs.get("ignore_index", -100)
            if ignore.any():
                out[ignore] = 0
        ctx.set_output("Y", out.astype(np.float32, copy=False))

    def backward(self, ctx):
        x = ctx.input("X")
        label = ctx.input("Label")
        g = ctx.input("Y@GRAD").reshape(-1)
        n = x.shape[0]
        if ctx.attrs.get("soft_label"):
            dx = -np.asarray(label, dtype=np.float32) / np.maximum(x, self.EPS) * g[:, None]
        else:
            lab = _label_index(label, n, ctx.input_name('Label'))
            dx = np.zeros_like(x)
            keep = lab != ctx.attrs.get("ignore_index", -100)
            rows = np.arange(n)[keep]
            cols = lab[keep]
            dx[rows, cols] = -g[keep] / np.maximum(x[rows, cols], self.EPS)
        ctx.set_output("X@GRAD", dx.astype(np.float32, copy=False))


@register_op
class LogLoss(OpDef):
    """Out = -label*log(p+eps) - (1-label)*log(1-p+eps)."""

    type = "log_loss"
    grad_slots = ("Predicted",)

    def forward(self, ctx):
        p = ctx.input("Predicted")
        y = np.asarray(ctx.input("Labels"), dtype=np.float32).reshape(p.shape)
        eps = np.float32(ctx.attrs.get("epsilon", 1e-4))
        out = -y * np.log(p + eps) - (1 - y) * np.log(1 - p + eps)
        ctx.set_output("Loss", out.astype(np.float32, copy=False))

    def backward(self, ctx):
        p = ctx.input("Predicted")
        y = np.asarray(ctx.input("Labels"), dtype=np.float32).reshape(p.shape)
        eps = np.float32(ctx.attrs.get("epsilon", 1e-4))
        g = ctx.input("Loss@GRAD")
        ctx.set_output("Predicted@GRAD", (g * (-y / (p + eps) + (1 - y) / (1 - p + eps))).astype(np.float32))


@register_op
class SigmoidCrossEntropyWithLogits(OpDef):
    """Out = max(x, 0) - x*label + log(1 + exp(-|x|)), stable for any logit."""

    type = "sigmoid_cross_entropy_with_logits"
    grad_slots = ("X",)

    def _mask(self, ctx, y):
        return y != ctx.attrs.get("ignore_index", -100)

    def forward(self, ctx):
        x = ctx.input("X")
        y = np.asarray(ctx.input("Label"), dtype=np.float32).reshape(x.shape)
        out = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
        keep = self._mask(ctx, y)
        out = np.where(keep, out, 0).astype(np.float32)
        if ctx.attrs.get("normalize"):
            out /= max(int(keep.sum()), 1)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        x = ctx.input("X")
        y = np.asarray(ctx.input("Label"), dtype=np.float32).reshape(x.shape)
        g = ctx.input("Out@GRAD")
        sig = 1 / (1 + np.exp(-x))
        keep = self._mask(ctx, y)
        dx = np.where(keep, (sig - y) * g, 0).astype(np.float32)
        if ctx.attrs.get("normalize"):
            dx /= max(int(keep.sum()), 1)
        ctx.set_output("X@GRAD", dx)
