"""CTR-DNN local training speed: examples/s with batch 1000 and 2 training threads.

Prints one JSON line. The data are generated Criteo-format lines loaded into an
InMemoryDataset first, so the figure is the engine's (parsing has bench_reader.py).

    python benchmarks/bench_local_train.py [--batches 60] [--threads 2] [--profile]

--profile adds the top functions by time (one thread, cProfile) to the JSON line.
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "ctr_dnn"))

import fleet  # noqa: E402
from fleet import optimizer  # noqa: E402
from network import ctr_dnn_model  # noqa: E402
from role_makers import LocalRoleMaker  # noqa: E402
import generate_data  # noqa: E402


def build(lr=1e-3):
    fleet.init(LocalRoleMaker())
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        inputs, loss, auc, _, _, _ = ctr_dnn_model()
        startup.random_seed = 1
        optimizer.Adam(lr, lazy_mode=True).minimize(loss)
    return main, startup, inputs, loss, auc


def dataset_for(inputs, files, threads, batch):
    ds = fleet.DatasetFactory().create_dataset("InMemoryDataset")
    ds.set_use_var(inputs)
    ds.set_data_format("criteo", hash_dim=1000001)
    ds.set_batch_size(batch)
    ds.set_thread(threads)
    ds.set_filelist(files)
    ds.load_into_memory()
    return ds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    # data (and models) of up to gigabytes: removed also on failure or Ctrl-C
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        lines = args.batches * args.batch_size
        generate_data.main(["--out_dir", tmp, "--train_lines", str(lines), "--test_lines", "1000",
                            "--train_files", str(max(args.threads, 2))])
        files = sorted(os.path.join(tmp, "train", f) for f in os.listdir(os.path.join(tmp, "train")))
        main_p, startup, inputs, loss, auc = build()
        exe = fleet.Executor()
        scope = fleet.Scope()
        exe.run(startup, scope=scope)
        ds = dataset_for(inputs, files, args.threads, args.batch_size)
        # warm-up pass: compiles (or loads cached) kernels and touches the table's pages
        exe.train_from_dataset(main_p, ds, scope=scope, thread=args.threads, print_period=0)
        t0 = time.perf_counter()
        summary = exe.train_from_dataset(main_p, ds, scope=scope, thread=args.threads, print_period=0)
        elapsed = time.perf_counter() - t0
        result = {
            "bench": "local_train", "model": "ctr_dnn", "batch_size": args.batch_size, "threads": args.threads,
            "examples": summary["examples"], "seconds": round(elapsed, 3),
            "examples_per_sec": round(summary["examples"] / elapsed, 1),
            "ms_per_batch": round(1000 * elapsed / max(summary["batches"], 1), 2),
            "goal": "at least an equivalent PyTorch CPU model (37-39k examples/s on the 2-core reference machine)",
            "nproc": os.cpu_count(),
        }
        if args.profile:
            # cProfile sees only its own thread: profile the same steps run by exe.run here.
            feeds = list(ds.batches())
            prof = cProfile.Profile()
            prof.enable()
            for feed in feeds:
                exe.run(main_p, feed=feed, scope=scope)
            prof.disable()
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
            top = []
            total = sum(v[2] for v in stats.stats.values())
            slowest = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:10]
            for (fname, line, func), (cc, nc, tt, ct, callers) in slowest:
                top.append({"function": f"{os.path.basename(fname)}:{line}:{func}", "seconds": round(tt, 3),
                            "share": round(tt / total, 3), "calls": nc})
            result["profile_one_thread"] = top
    print(json.dumps(result))


if __name__ == "__main__":
    main()
