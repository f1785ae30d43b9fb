"""Evaluates a saved CTR-DNN model on test data: prints AUC and log loss.

Usage: python infer.py --model_dir output/epoch_0 --data_dir data
"""
import argparse
import glob
import json
import os

import numpy as np

import fleet
from network import ctr_dnn_model
from role_makers import LocalRoleMaker


def auc_score(labels, scores):
    """ROC AUC by ranks (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def criteo_dataset(inputs, files, hash_dim, batch_size):
    """A dataset of the Criteo ``files`` read by one thread, so its batches come in file
    order, the same every run."""
    dataset = fleet.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(inputs)
    dataset.set_data_format("criteo", hash_dim=hash_dim)
    dataset.set_batch_size(batch_size)
    dataset.set_thread(1)
    dataset.set_filelist(files)
    return dataset


def predict_files(exe, test_program, inputs, predict, files, hash_dim, batch_size=2000):
    """(labels, click probabilities) as float64 arrays of every line of the Criteo ``files``,
    predicted by ``test_program`` (one reader thread, so in file order)."""
    labels, scores = [], []
    for feed in criteo_dataset(inputs, files, hash_dim, batch_size).batches():
        p, = exe.run(test_program, feed=feed, fetch_list=[predict])
        scores.append(p[:, 1])
        labels.append(np.asarray(feed["label"]).reshape(-1))
    return np.concatenate(labels).astype(np.float64), np.concatenate(scores).astype(np.float64)


def evaluate(model_dir, data_dir, sparse_feature_dim=1000001, batch_size=2000):
    """Returns {"auc", "log_loss", "examples"} of the model saved in ``model_dir``."""
    fleet.init(LocalRoleMaker())
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        inputs, _, _, _, predict, _ = ctr_dnn_model(sparse_feature_dim)
    test_program = main.clone(for_test=True)
    exe = fleet.Executor()
    exe.run(startup)
    fleet.load_persistables(exe, model_dir, main)
    files = sorted(glob.glob(os.path.join(data_dir, "test", "*")))
    if not files:
        raise SystemExit(f"no test files in {data_dir}/test")
    labels, scores = predict_files(exe, test_program, inputs, predict, files, sparse_feature_dim, batch_size)
    clipped = np.clip(scores, 1e-7, 1 - 1e-7)
    log_loss = float(-np.mean(labels * np.log(clipped) + (1 - labels) * np.log(1 - clipped)))
    return {"auc": auc_score(labels, scores), "log_loss": log_loss, "examples": int(len(labels))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data_dir", default="data")
    p.add_argument("--sparse_feature_dim", type=int, default=1000001)
    args = p.parse_args(argv)
    result = evaluate(args.model_dir, args.data_dir, args.sparse_feature_dim)
    print(f"test AUC {result['auc']:.4f}, log loss {result['log_loss']:.4f} on {result['examples']} examples")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
