"""Evaluates a saved CTR-DNN model on Criteo test files (PaddleFleetX's run_infer): builds
the network in a test program, loads the saved parameters into a fresh scope, zeroes the
AUC statistics the save carried, and runs the test lines batch by batch. Prints one JSON
line {"auc", "loss" (mean per example), "examples"}.

Where it differs from the Paddle script: the AUC statistics are the program's ``auc.*``
variables (Paddle's ``_generated_var_N``); they are zeroed as Paddle's ``set_zero`` does
(``scope.var(name).get_tensor()``, ``_get_dims()``, ``set(array, place)``).
"""
import json
import os
import sys

import numpy as np

import fleet.fluid as fluid
from argument import params_args
from dataset_generator import DacDataset
from network import CTR


def batches(files, batch_size):
    """Yields feed dicts of ``batch_size`` test lines, parsed as the train pipe does."""
    parser, rows = DacDataset(), []
    for path in files:
        with open(path) as f:
            for line in f:
                rows.append(dict(next(iter(parser.generate_sample(line)()))))
                if len(rows) == batch_size:
                    yield _feed(rows)
                    rows = []
    if rows:
        yield _feed(rows)


def _feed(rows):
    n = len(rows)
    feed = {"dense_input": np.array([r["dense_feature"] for r in rows], dtype="float32"),
            "label": np.array([r["label"] for r in rows], dtype="int64")}
    for i in range(1, 27):
        feed["C" + str(i)] = (np.array([r["C" + str(i)][0] for r in rows], dtype="int64"), np.ones(n, "int64"))
    return feed


def set_zero(var_name, scope=fluid.global_scope(), place=fluid.CPUPlace(), param_type="int64"):
    param = scope.var(var_name).get_tensor()
    param_array = np.zeros(param._get_dims()).astype(param_type)
    param.set(param_array, place)


def run_infer(params, model_path):
    place = fluid.CPUPlace()
    inference_scope = fluid.Scope()
    startup_program, test_program = fluid.Program(), fluid.Program()
    with fluid.scope_guard(inference_scope), fluid.program_guard(test_program, startup_program):
        ctr_model = CTR()
        inputs = ctr_model.input_data(params)
        loss, auc_var, batch_auc_var = ctr_model.net(inputs, params)
        exe = fluid.Executor(place)
        exe.run(startup_program)
        fluid.io.load_persistables(executor=exe, dirname=model_path, main_program=test_program)
        for var in test_program.list_vars():
            if var.persistable and var.name.startswith("auc."):
                set_zero(var.name, scope=inference_scope, place=place)
        files = sorted(os.path.join(params.test_files_path, x) for x in os.listdir(params.test_files_path))
        losses, examples, auc_val = [], 0, None
        for feed in batches(files, params.batch_size):
            loss_val, auc_val = exe.run(test_program, feed=feed, fetch_list=[loss, auc_var])
            losses.append(float(loss_val[0]))
            examples += len(feed["label"])
    return {"auc": float(auc_val[0]), "loss": sum(losses) / examples, "examples": examples}


if __name__ == "__main__":
    model_path = sys.argv[1]
    params = params_args(sys.argv[2:])
    print(json.dumps(run_infer(params, model_path)))
