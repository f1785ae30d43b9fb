"""Inference models: a program pruned to what its targets need, saved with its parameters.

``save_inference_model`` writes one atomic directory (``fleet.framework.io``) laid out as
Paddle 1.x lays it out: the pruned program in the file ``__model__`` (or
``model_filename``; fleet's versioned JSON program format inside, see
``Program.parse_from_string``), one file per persistable variable it reads, named as the
variable (or all of them in ``params_filename``), and ``MANIFEST.json`` with the checksums
and the feed and fetch names. ``load_inference_model`` reads it back into a scope and
returns ``[program, feed_names, fetch_targets]`` as Paddle's
``fluid.io.load_inference_model`` does; ``Executor().run(program, feed=..., fetch_list=
fetch_targets)`` then predicts with no servers and no training code. Directories written
by the previous fleet (manifest format ``fleet-vars-1``, sanitised file names) still load.

An ``is_distributed`` table saved from a distributed worker is stored as
``<table>@ids`` / ``<table>@values`` and read through ``saved_table_prefetch``
(``fleet/framework/ops/saved_table.py``); ``use_saved_tables`` rewrites a program that way.
"""
import os

import numpy as np

from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.ops.saved_table import SAVED_TABLE_PREFETCH
from fleet.framework.passes import table_readers
from fleet.framework.program import FORWARD, Operator, Program, Variable, deserialize_program, serialize_program
from fleet.framework.scope import global_scope

MODEL_FILE = "__model__"
KIND = "inference"


def _check_names(feeded_var_names, target_vars, export_for_deployment):
    """Paddle's argument checks of ``save_inference_model``; returns (feed names, targets)."""
    if isinstance(feeded_var_names, str):
        feeded_var_names = [feeded_var_names]
    elif export_for_deployment and feeded_var_names:
        if not all(isinstance(n, str) for n in feeded_var_names):
            raise ValueError("'feed_var_names' should be a list of str.")
    if isinstance(target_vars, Variable):
        target_vars = [target_vars]
    elif export_for_deployment:
        if not (target_vars and all(isinstance(v, Variable) for v in target_vars)):
            raise ValueError("'target_vars' should be a list of Variable.")
    return list(feeded_var_names or []), list(target_vars)


def prune_program(program, feed_names, target_names):
    """Returns a copy of ``program`` with only the ops ``target_names`` need, given that
    ``feed_names`` are fed (ops that compute a fed variable are dropped too).

    Raises:
        ConfigError: a target is not in the program, or needs a value that is neither fed
            nor persistable nor computed (names it and the fix).
    """
    block = program.global_block()
    for name in list(feed_names) + list(target_names):
        block.var(name)  # ConfigError naming it
    feeds = set(feed_names)
    needed = set(target_names)
    kept = []
    for op in reversed(block.ops):
        outs = set(op.output_arg_names)
        if not outs & needed or outs <= feeds:
            continue
        kept.append(op)
        needed |= set(op.input_arg_names)
    kept.reverse()
    produced = {n for op in kept for n in op.output_arg_names}
    for name in sorted(needed):
        var = block.vars.get(name)
        if name in feeds or name in produced or (var is not None and var.persistable):
            continue
        raise ConfigError(
            f"the targets {sorted(target_names)} need {name!r}, which is not fed and no kept op "
            f"computes it; add it to feeded_var_names (fed: {sorted(feeds)})")
    pruned = Program()
    pruned._random_seed = program._random_seed
    pruned._is_test = program._is_test
    dst = pruned.global_block()
    used = needed | feeds | produced
    for name, var in block.vars.items():
        if name in used:
            dst.vars[name] = var._copy_to(dst)
    for op in kept:
        dst.ops.append(op._copy_to(dst))
    pruned._bump()
    return pruned


def inference_program(program, feeded_var_names, target_vars, export_for_deployment=True):
    """Returns (program to save, feed names, fetch names): with ``export_for_deployment``
    a test clone of ``program`` pruned to the targets, else a full test clone.

    Raises:
        ValueError: Paddle's messages for feed names or targets of the wrong type.
        ConfigError: a target needs an input that is not fed.
    """
    feed_names, targets = _check_names(feeded_var_names, target_vars, export_for_deployment)
    fetch_names = [t.name if isinstance(t, Variable) else str(t) for t in targets]
    test = program.clone(for_test=True)
    if export_for_deployment:
        test = prune_program(test, feed_names, fetch_names)
    return test, feed_names, fetch_names


def use_saved_tables(program, tables):
    """Rewrites ``program`` (in place) to read each table of ``tables`` ({name: dim}) from
    ``<table>@ids`` / ``<table>@values`` through one ``saved_table_prefetch`` op placed
    before the first lookup of the table. Tables the program does not look up are skipped.

    Returns:
        The names of the persistable variables the rewritten program reads for the tables.
    """
    block = program.global_block()
    ops = block.ops
    reads = []
    for table, dim in sorted(tables.items()):
        first, id_vars = table_readers(ops, table)
        if first is None:
            continue
        ids_name, values_name = table + "@ids", table + "@values"
        block.create_var(ids_name, shape=(-1,), dtype="int64", persistable=True, stop_gradient=True)
        block.create_var(values_name, shape=(-1, dim), dtype="float32", persistable=True, stop_gradient=True)
        block.vars[table].persistable = False
        op = Operator(block, SAVED_TABLE_PREFETCH,
                      {"Ids": id_vars, "TableIds": [ids_name], "TableValues": [values_name]},
                      {"Out": [table]}, {"table": table, "op_role": FORWARD})
        ops.insert(first, op)
        reads += [ids_name, values_name]
    program._bump()
    return reads


def persistable_names(program):
    """Names of the persistable, non-data variables ``program``'s ops read or write."""
    block = program.global_block()
    used = {n for op in block.ops for n in op.input_arg_names + op.output_arg_names}
    return sorted(n for n, v in block.vars.items() if v.persistable and not v.is_data and n in used)


def manifest_extra(feed_names, fetch_names, **more):
    """The manifest metadata of an inference model."""
    extra = {"kind": KIND, "feed": list(feed_names), "fetch": list(fetch_names)}
    extra.update(more)
    return extra


def file_names(model_filename=None, params_filename=None):
    """Paddle's file names of an inference model: (the program's file, the parameters'
    file or None for one file per variable); directories are dropped, as Paddle does."""
    model = os.path.basename(model_filename) if model_filename is not None else MODEL_FILE
    params = os.path.basename(params_filename) if params_filename is not None else None
    if not model:
        raise ConfigError(f"model_filename={model_filename!r} names no file; give a file name such as "
                          f"'__model__'")
    if params is not None and params == model:
        raise ConfigError(f"model_filename and params_filename are both {model!r}; give them different names")
    return model, params


def save_inference_model(dirname, feeded_var_names, target_vars, main_program, scope=None,
                         export_for_deployment=True, model_filename=None, params_filename=None,
                         program_only=False):
    """Saves ``main_program`` pruned to ``target_vars`` with the values it reads from
    ``scope`` (default: the global scope), atomically, in Paddle's layout.

    Args:
        dirname: the directory to create or replace.
        feeded_var_names: the input names (a str or a list of str).
        target_vars: the Variables to predict (one or a list).
        main_program: the program to prune.
        scope: where the values are (default: the global scope).
        export_for_deployment: prune to what the targets need (else a whole test clone).
        model_filename: the program's file (default ``__model__``).
        params_filename: one file for every variable (default: one file per variable,
            named as the variable).
        program_only: save the program only, no variables.

    Returns:
        The fetch names.

    Raises:
        ValueError / ConfigError: bad names, or a value that is not in the scope.
    """
    program, feed_names, fetch_names = inference_program(main_program, feeded_var_names, target_vars,
                                                         export_for_deployment)
    model_file, params_file = file_names(model_filename, params_filename)
    scope = global_scope() if scope is None else scope
    names = [] if program_only else persistable_names(program)
    missing = [n for n in names if scope.value(n) is None]
    if missing:
        raise ConfigError(f"cannot save the inference model: {missing[:5]} have no value in the scope; "
                          f"run the startup program (and train) first")
    extra = manifest_extra(feed_names, fetch_names, model_filename=model_file, params_filename=params_file,
                           program_only=bool(program_only))
    with fio.VarsWriter(dirname, extra, filename=params_file) as writer:
        writer.add_file(model_file, serialize_program(program))
        for name in names:
            writer.add(name, np.asarray(scope.value(name)))
    return fetch_names


def load_inference_model(dirname, executor=None, model_filename=None, params_filename=None, scope=None):
    """Loads an inference model saved by ``save_inference_model`` (local or distributed),
    as Paddle's ``fluid.io.load_inference_model``.

    Args:
        dirname: the saved directory.
        executor: accepted for Paddle compatibility (values go to ``scope``).
        model_filename: the program's file, as given when saving (default ``__model__``).
        params_filename: the variables' file, as given when saving (default: one file
            per variable); the manifest records it, so None also reads a combined save.
        scope: where the values go (default: the global scope).

    Returns:
        [program, feed_names, fetch_targets]: fetch_targets are the program's Variables.

    Raises:
        ConfigError: not an inference model, incomplete, or saved under other file
            names (the message gives the ones to pass).
        DataError: a damaged file (names it).
    """
    manifest = fio.read_manifest(dirname)
    extra = manifest.get("extra", {})
    model_file, params_file = file_names(model_filename, params_filename)
    files = manifest.get("files", {})
    if extra.get("kind") != KIND or not files:
        raise ConfigError(
            f"{dirname!r} is not an inference model (it holds no {MODEL_FILE}); save one with "
            f"fleet.save_inference_model(exe, dirname, feeded_var_names, target_vars)")
    if model_file not in files:
        raise ConfigError(f"{dirname!r} holds no program file {model_file!r}; it was saved with "
                          f"model_filename={sorted(files)[0]!r}: pass that to load_inference_model")
    saved_params = sorted(manifest.get("combined", {}))
    if params_file is not None and saved_params != [params_file]:
        how = f"params_filename={saved_params[0]!r}" if saved_params else "one file per variable (params_filename=None)"
        raise ConfigError(f"{dirname!r} holds no parameter file {params_file!r}; it was saved with {how}: "
                          f"pass that to load_inference_model")
    program = deserialize_program(fio.read_file(dirname, model_file))
    names = persistable_names(program)
    if extra.get("program_only"):
        names = [n for n in names if n in manifest["vars"]]
    values = fio.read_vars(dirname, names)
    scope = global_scope() if scope is None else scope
    for name in names:
        if name.endswith("@ids") and name[:-4] + "@values" in values:
            continue
        if name.endswith("@values") and name[:-7] + "@ids" in values:
            ids, rows = values[name[:-7] + "@ids"], values[name]
            order = np.argsort(ids, kind="stable")
            scope[name[:-7] + "@ids"] = np.ascontiguousarray(ids[order])
            scope[name] = np.ascontiguousarray(rows[order])
            continue
        scope[name] = np.array(values[name])
    block = program.global_block()
    fetch_targets = [block.var(n) for n in extra["fetch"]]
    return [program, list(extra["feed"]), fetch_targets]
