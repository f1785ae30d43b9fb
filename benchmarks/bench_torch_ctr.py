"""CTR-DNN in fleet next to an equivalent PyTorch CPU model, same data, batch and threads.

The PyTorch model is the CTR-DNN of examples/ctr_dnn/network.py: one shared
``nn.EmbeddingBag`` (sum, sparse gradients) over the 26 slots, concatenated with the 13
dense features, three Linear(400) + ReLU, Linear(2), softmax cross entropy; Adam(lr) on the dense weights and SparseAdam(lr)
on the table (the lazy Adam fleet uses). Both read the same batches, already parsed into
memory, so the figures compare training engines, not readers.

Prints one JSON line: for fleet (local, ``--threads`` Hogwild threads) and torch
(``torch.set_num_threads(--threads)``), examples/s of a warm pass and the test AUC after
``--epochs`` epochs over ``--lines`` generated lines.

    python benchmarks/bench_torch_ctr.py [--lines 200000] [--epochs 2] [--threads 2]

Needs torch (not a dependency of fleet): ``pip install torch``. Without it, prints a
JSON line saying so and exits 0, so benchmarks/run_all.py can skip it.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "ctr_dnn"))

import fleet  # noqa: E402
from fleet import optimizer  # noqa: E402
from role_makers import LocalRoleMaker  # noqa: E402
import generate_data  # noqa: E402
from infer import auc_score  # noqa: E402
from network import SLOTS, ctr_dnn_model  # noqa: E402

HASH_DIM = 1000001


def load_batches(files, batch_size):
    """The dataset's feeds, parsed once: [{name: array or (values, lengths)}]."""
    fleet.init(LocalRoleMaker())
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        inputs, *_ = ctr_dnn_model(HASH_DIM)
    ds = fleet.DatasetFactory().create_dataset("InMemoryDataset")
    ds.set_use_var(inputs)
    ds.set_data_format("criteo", hash_dim=HASH_DIM)
    ds.set_batch_size(batch_size)
    ds.set_thread(1)
    ds.set_filelist(files)
    ds.load_into_memory()
    return list(ds.batches())


# ----------------------------------------------------------------------------- fleet
def fleet_run(train_files, test_batches, args):
    fleet.init(LocalRoleMaker())
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        inputs, loss, _, _, predict, _ = ctr_dnn_model(HASH_DIM)
        startup.random_seed = args.seed
        optimizer.Adam(args.lr, lazy_mode=True).minimize(loss)
    test_program = main.clone(for_test=True)
    exe, scope = fleet.Executor(), fleet.Scope()
    exe.run(startup, scope=scope)
    ds = fleet.DatasetFactory().create_dataset("InMemoryDataset")
    ds.set_use_var(inputs)
    ds.set_data_format("criteo", hash_dim=HASH_DIM)
    ds.set_batch_size(args.batch_size)
    ds.set_thread(args.threads)
    ds.set_filelist(train_files)
    ds.load_into_memory()
    rates = []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        summary = exe.train_from_dataset(main, ds, scope=scope, thread=args.threads, print_period=0)
        rates.append(summary["examples"] / (time.perf_counter() - t0))
    labels, scores = [], []
    for feed in test_batches:
        p, = exe.run(test_program, feed=feed, fetch_list=[predict], scope=scope)
        scores.append(p[:, 1])
        labels.append(np.asarray(feed["label"]).reshape(-1))
    auc = auc_score(np.concatenate(labels), np.concatenate(scores).astype(np.float64))
    # the first epoch pays kernel loading and the table's first page touches
    return {"examples_per_sec": round(rates[-1] if len(rates) > 1 else rates[0]), "test_auc": round(auc, 4)}


# ----------------------------------------------------------------------------- torch
def torch_batches(batches, torch):
    """Feeds -> (ids, offsets, dense, label) tensors; bags are slot-major."""
    out = []
    for feed in batches:
        n = len(feed["label"])
        ids, lengths = [], []
        for s in range(1, SLOTS + 1):
            slot = feed[f"C{s}"]  # a LoDTensor: flat ids and offsets [batch + 1]
            ids.append(np.asarray(slot.values, dtype=np.int64).reshape(-1))
            lengths.append(np.diff(np.asarray(slot.offsets, dtype=np.int64)))
        lengths = np.concatenate(lengths)
        offsets = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        out.append((torch.from_numpy(np.concatenate(ids)), torch.from_numpy(offsets),
                    torch.from_numpy(np.ascontiguousarray(feed["dense_input"], dtype=np.float32)),
                    torch.from_numpy(np.asarray(feed["label"], dtype=np.int64).reshape(n))))
    return out


def torch_model(torch, seed):
    nn = torch.nn
    torch.manual_seed(seed)

    class CtrDnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.EmbeddingBag(HASH_DIM, 10, mode="sum", sparse=True)
            nn.init.uniform_(self.table.weight, -1.0, 1.0)
            layers, width = [], SLOTS * 10 + 13
            for out in (400, 400, 400, 2):
                fc = nn.Linear(width, out)
                nn.init.normal_(fc.weight, 0.0, 1.0 / math.sqrt(width))
                nn.init.zeros_(fc.bias)
                layers.append(fc)
                width = out
            self.fcs = nn.ModuleList(layers)

        def forward(self, ids, offsets, dense):
            n = dense.shape[0]
            pooled = self.table(ids, offsets).view(SLOTS, n, 10).transpose(0, 1).reshape(n, SLOTS * 10)
            x = torch.cat([pooled, dense], dim=1)
            for fc in self.fcs[:-1]:
                x = torch.relu(fc(x))
            return self.fcs[-1](x)

    return CtrDnn()


def torch_run(train, test, args):
    import torch

    torch.set_num_threads(args.threads)
    model = torch_model(torch, args.seed)
    dense_params = [p for name, p in model.named_parameters() if not name.startswith("table")]
    opt_dense = torch.optim.Adam(dense_params, lr=args.lr)
    opt_sparse = torch.optim.SparseAdam([model.table.weight], lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    train_t, test_t = torch_batches(train, torch), torch_batches(test, torch)
    rates = []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        examples = 0
        for ids, offsets, dense, label in train_t:
            opt_dense.zero_grad()
            opt_sparse.zero_grad()
            loss = loss_fn(model(ids, offsets, dense), label)
            loss.backward()
            opt_dense.step()
            opt_sparse.step()
            examples += len(label)
        rates.append(examples / (time.perf_counter() - t0))
    labels, scores = [], []
    with torch.no_grad():
        for ids, offsets, dense, label in test_t:
            scores.append(torch.softmax(model(ids, offsets, dense), dim=1)[:, 1].numpy())
            labels.append(label.numpy())
    auc = auc_score(np.concatenate(labels), np.concatenate(scores).astype(np.float64))
    return {"examples_per_sec": round(rates[-1] if len(rates) > 1 else rates[0]), "test_auc": round(auc, 4),
            "torch": torch.__version__}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(json.dumps({"bench": "torch_ctr", "skipped": "torch is not installed (pip install torch)"}))
        return
    # data (and models) of up to gigabytes: removed also on failure or Ctrl-C
    with tempfile.TemporaryDirectory(prefix="fleet-bench-torch-") as tmp:
        generate_data.main(["--out_dir", tmp, "--train_lines", str(args.lines), "--test_lines", "50000"])
        train_files = sorted(os.path.join(tmp, "train", f) for f in os.listdir(os.path.join(tmp, "train")))
        test_files = sorted(os.path.join(tmp, "test", f) for f in os.listdir(os.path.join(tmp, "test")))
        train = load_batches(train_files, args.batch_size)
        test = load_batches(test_files, 2000)
        result = {"bench": "torch_ctr", "model": "ctr_dnn", "lines": args.lines, "epochs": args.epochs,
                  "batch_size": args.batch_size, "threads": args.threads, "nproc": os.cpu_count()}
        result["fleet"] = fleet_run(train_files, test, args)
        result["torch"] = torch_run(train, test, args)
        result["speed_vs_torch"] = round(result["fleet"]["examples_per_sec"] / result["torch"]["examples_per_sec"], 3)
        result["auc_minus_torch"] = round(result["fleet"]["test_auc"] - result["torch"]["test_auc"], 4)
        result["goal"] = "fleet examples/s >= torch; test AUC within 0.005 of torch at equal epochs"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
