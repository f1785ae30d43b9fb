"""The data of the dist_fleet_ctr test script: ``prepare_data()`` writes (once, atomically)
a small generated click log and returns its sizes and path; run as a pipe command this
module turns its lines into the MultiSlot slots dnn_data, lr_data and click.

A line is ``<dnn ids>\\t<lr ids>\\t<click>`` (ids comma-separated, 1 to 5 per example);
the click is drawn from a logistic model of hidden per-id weights of both id sets, so a
model that learns them predicts clicks well above chance."""
import os
import tempfile

import numpy as np

import fleet.data_generator as dg

DNN_INPUT_DIM, LR_INPUT_DIM, LINES, SEED = 1000, 1000, 20000, 7


def prepare_data():
    """Returns (dnn_input_dim, lr_input_dim, train_file_path), writing the file if needed."""
    path = os.path.join(tempfile.gettempdir(), "fleet_dist_fleet_ctr_data_v1", "train.txt")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(SEED)
        dnn_w, lr_w = rng.normal(0, 1.5, DNN_INPUT_DIM), rng.normal(0, 1.5, LR_INPUT_DIM)
        lines = []
        for _ in range(LINES):
            dnn = rng.integers(0, DNN_INPUT_DIM, rng.integers(1, 6))
            lr = rng.integers(0, LR_INPUT_DIM, rng.integers(1, 6))
            logit = dnn_w[dnn].mean() + lr_w[lr].mean() - 0.5
            click = int(rng.random() < 1 / (1 + np.exp(-logit)))
            lines.append(",".join(map(str, dnn)) + "\t" + ",".join(map(str, lr)) + "\t" + str(click) + "\n")
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
        os.replace(tmp, path)  # processes preparing at once write the same bytes
    return DNN_INPUT_DIM, LR_INPUT_DIM, path


class DatasetCtrReader(dg.MultiSlotDataGenerator):
    def generate_sample(self, line):
        def iter_func():
            dnn, lr, click = line.rstrip("\n").split("\t")
            yield [("dnn_data", [int(i) for i in dnn.split(",")]), ("lr_data", [int(i) for i in lr.split(",")]),
                   ("click", [int(click)])]

        return iter_func


if __name__ == "__main__":
    DatasetCtrReader().run_from_stdin()
