"""Test helper: loads persistables that dist_fleet_ctr.py saved (SAVE_DIRNAME) into its
network built locally, predicts the train file and prints one JSON line {"auc",
"examples"} (AUC by ranks of the predicted click probability).

Usage: python evaluate_saved.py SAVED_DIR
"""
import argparse
import json
import sys

import numpy as np

import fleet
import fleet.fluid as fluid
from dist_fleet_ctr import TestDistCTR2x2


def main(dirname):
    model = TestDistCTR2x2()
    main_program, startup = fluid.Program(), fluid.Program()
    with fluid.scope_guard(fluid.Scope()), fluid.program_guard(main_program, startup):
        model.net(argparse.Namespace(reader="dataset"))
        test_program = main_program.clone(for_test=True)
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(startup)
        fleet.load_persistables(exe, dirname, main_program=test_program)
        dnn, lr, labels = [], [], []
        with open(model.train_file_path) as f:
            for line in f:
                d, w, c = line.rstrip("\n").split("\t")
                dnn.append([int(i) for i in d.split(",")])
                lr.append([int(i) for i in w.split(",")])
                labels.append(int(c))
        feed = {"dnn_data": dnn, "lr_data": lr, "click": np.array(labels, "int64").reshape(-1, 1)}
        predict, = exe.run(test_program, feed=feed, fetch_list=[model.predict])
    scores, labels = predict[:, 1], np.array(labels)
    ranks = scores.argsort().argsort() + 1.0
    pos = labels.sum()
    auc = (ranks[labels == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(labels) - pos))
    print(json.dumps({"auc": float(auc), "examples": int(len(labels))}))


if __name__ == "__main__":
    main(sys.argv[1])
