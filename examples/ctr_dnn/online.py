"""Online (day/pass) training of CTR-DNN, as production CTR models are trained.

Data arrive pass by pass in Paddle's layout (``generate_online_data.py`` writes it):
``<data_dir>/YYYYMMDD/HHMM/part-*`` with an empty done file (``to.hadoop.done``) written
once the pass's files are complete, and held-out lines of each pass in
``<data_dir>/test/YYYYMMDD/HHMM/``. For every pass of ``--days`` days of
``--passes_per_day`` passes, in order, every worker:

1. waits for the pass's done file (bounded: ``--wait_timeout`` seconds, saying what it
   waits for; then it stops with an error naming the missing done file);
2. trains on its share of the pass's files (``fleet.split_files``);
3. after every worker has trained the pass, the first worker measures the test AUC on the
   pass's held-out lines and saves: a delta (``save_persistables(mode=1)``: the rows
   changed since the previous save, and the ids deleted since) after every pass; after the
   last pass of a day ``fleet.shrink()`` and a base (``mode=2``, Paddle's rule: rows whose
   score reaches base_threshold; ``--base_mode 0``: every row) instead; the first save of
   a run is a base too, so each chain starts with one;
4. only then records the pass as done in ``<model_dir>/progress.json`` (written atomically:
   a temporary file, fsync, rename) and prints one line: pass, rows of the table (summed
   over servers), test AUC, seconds.

Kill any process (even with SIGKILL) at any moment and start the same command again: the
servers load the last recorded save with ``fleet.init_server(<save>)``, which walks the
chain back to its base; the workers skip the passes recorded as done. A pass interrupted
before its record is trained again from the state before it, so every pass is trained once
into the model that survives. Save directories are ``<model_dir>/YYYYMMDD/HHMM`` (each
pass's save, whatever its mode; a save is atomic: complete or absent).

Locally:      python online.py --data_dir online_data --model_dir online_model
Distributed:  fleetrun --server_num 2 --worker_num 2 online.py --data_dir online_data \\
                  --model_dir online_model

``<model_dir>/online.jsonl`` gets one JSON line per event (pass started, pass done with
its figures, pass skipped), appended by the first worker: the log a monitor or a test reads.
"""
import argparse
import glob
import json
import os
import threading
import time

import fleet
from fleet import telemetry
from fleet.local_tables import local_tables
from generate_online_data import DONE_FILE, START_DAY, pass_dirname
from infer import auc_score, predict_files
from network import ctr_dnn_model
from role_makers import PaddleCloudRoleMaker
from train import make_optimizer, make_strategy, thread_batch_size

PROGRESS = "progress.json"
EVENTS = "online.jsonl"
TABLE = "SparseFeatFactors"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", default="online_data", help="the stream: YYYYMMDD/HHMM/ pass directories")
    p.add_argument("--model_dir", default="online_model", help="saves, progress.json and online.jsonl")
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--passes_per_day", type=int, default=4, help="passes split each day evenly (divides 1440)")
    p.add_argument("--start_day", default=START_DAY, help="the first day, YYYYMMDD")
    p.add_argument("--done_file", default=DONE_FILE, help="the file that marks a pass's data complete")
    p.add_argument("--wait_timeout", type=float, default=3600.0,
                   help="seconds to wait for a pass's done file before stopping with an error")
    p.add_argument("--poll_seconds", type=float, default=1.0, help="seconds between looks for a done file")
    p.add_argument("--barrier_timeout", type=float, default=3600.0,
                   help="seconds a worker waits at a pass's barriers: for the others to finish training it, and for "
                        "the first worker's test and save")
    p.add_argument("--status_seconds", type=float, default=0.5,
                   help="servers rewrite <model_dir>/servers/server-<i>.json (rows, memory) this often")
    p.add_argument("--stop_after", type=int, default=0,
                   help="train at most this many passes in this start, then stop (0: every pass of --days)")
    p.add_argument("--entry", default="none",
                   help="admission of new ids: count:N (CountFilterEntry), probability:P (ProbabilityEntry) "
                        "or none (every id gets a row)")
    p.add_argument("--shrink", default="day", choices=["day", "pass", "never"],
                   help="fleet.shrink() after every day (default), after every pass, or never")
    p.add_argument("--base_mode", type=int, default=2, choices=[0, 2],
                   help="the mode of the bases: 2 (Paddle's base: rows whose score reaches base_threshold) or "
                        "0 (every row: a restart then reproduces the table exactly)")
    p.add_argument("--show_click_decay_rate", type=float, default=0.98)
    p.add_argument("--delete_threshold", type=float, default=0.8)
    p.add_argument("--delete_after_unseen_days", type=int, default=30)
    p.add_argument("--base_threshold", type=float, default=1.5)
    p.add_argument("--strategy", default="async", choices=["sync", "async", "half_async", "geo"])
    p.add_argument("--geo_k", type=int, default=100)
    p.add_argument("--merge_pushes", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adagrad"])
    p.add_argument("--sparse_feature_dim", type=int, default=1000001, help="ids are hashed into [0, this)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.passes_per_day < 1 or 1440 % args.passes_per_day:
        p.error(f"--passes_per_day {args.passes_per_day} must divide 1440 (the minutes of a day)")
    parse_entry(args.entry)  # a bad --entry stops here, before any process starts training
    return args


def parse_entry(text):
    """``--entry`` as a fleet entry (None for "none").

    Raises:
        SystemExit: not count:N, probability:P or none.
    """
    kind, _, value = text.partition(":")
    try:
        if kind == "none" and not value:
            return None
        if kind == "count":
            return fleet.CountFilterEntry(int(value))
        if kind == "probability":
            return fleet.ProbabilityEntry(float(value))
    except ValueError as e:  # fleet's ConfigError for a bad value is a ValueError too
        raise SystemExit(f"--entry {text!r}: {e}") from e
    raise SystemExit(f"--entry {text!r} is not count:N, probability:P or none")


# ------------------------------------------------------------------ the schedule and the data
def schedule(args):
    """[(day 0-based, pass 0-based, "YYYYMMDD/HHMM")] of every pass of the run, in order."""
    return [(d, p, pass_dirname(d, p, args.passes_per_day, args.start_day))
            for d in range(args.days) for p in range(args.passes_per_day)]


def wait_for_pass(args, name, log=print):
    """Blocks until the pass's done file exists, saying what it waits for (then every 30 s).

    Returns:
        The pass's data files, sorted (everything in its directory but the done file,
        hidden files and temporary ``*.tmp`` files).

    Raises:
        SystemExit: no done file after ``--wait_timeout`` seconds (names the file).
    """
    pass_dir = os.path.join(args.data_dir, name)
    done = os.path.join(pass_dir, args.done_file)
    start = time.monotonic()
    said = None
    while not os.path.exists(done):
        waited = time.monotonic() - start
        if waited >= args.wait_timeout:
            raise SystemExit(f"online.py: no done file {done} after waiting {args.wait_timeout:g} s "
                             f"(--wait_timeout): pass {name}'s data is not complete; start its producer or "
                             f"raise --wait_timeout")
        if said is None or waited - said >= 30:
            log(f"pass {name}: waiting for {done} ({waited:.0f} s so far, up to {args.wait_timeout:g} s)")
            said = waited
        time.sleep(min(args.poll_seconds, max(0.01, args.wait_timeout - waited)))
    files = [f for f in sorted(glob.glob(os.path.join(pass_dir, "*")))
             if os.path.isfile(f) and os.path.basename(f) != args.done_file and not f.endswith(".tmp")]
    if not files:
        raise SystemExit(f"online.py: pass {name} is marked done ({done}) but {pass_dir} holds no data file")
    return files


# ------------------------------------------------------------------ progress: what is done
def read_progress(model_dir):
    """The progress record: {"done": [pass names], "save": last save dir relative to
    model_dir or None, "chain_start": the pass whose save started the chain}."""
    try:
        with open(os.path.join(model_dir, PROGRESS)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"done": [], "save": None, "chain_start": None}


def write_progress(model_dir, progress):
    """Replaces progress.json atomically: a crash leaves the old record or the new one."""
    path = os.path.join(model_dir, PROGRESS)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(progress, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(model_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def log_event(model_dir, **event):
    with open(os.path.join(model_dir, EVENTS), "a") as f:
        f.write(json.dumps({"time": round(time.time(), 3), **event}) + "\n")


# ------------------------------------------------------------------ figures of a pass
def evaluate(exe, test_program, inputs, predict, files, hash_dim, batch_size=2000):
    """Test AUC of the current model on Criteo files (nothing is counted or created); None
    without files."""
    if not files:
        return None
    return auc_score(*predict_files(exe, test_program, inputs, predict, files, hash_dim, batch_size))


def write_server_status(model_dir, index, period, stop):
    """A server's status file, rewritten every ``period`` seconds until ``stop`` is set:
    ``<model_dir>/servers/server-<index>.json`` = {"time", "rows": {table: rows of this
    server's shard}, "table_bytes", "rss_bytes"} (from ``fleet.telemetry.snapshot()`` and
    /proc). The first worker sums the servers' files after each save."""
    path = os.path.join(model_dir, "servers", f"server-{index}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    while not stop.is_set():
        now = time.time()
        tables = (telemetry.snapshot().get("server") or {}).get("tables") or {}
        status = {"time": now, "rows": {t: v["rows"] for t, v in tables.items() if v["kind"] == "distributed"},
                  "table_bytes": sum(v["bytes"] for v in tables.values()), "rss_bytes": rss_bytes()}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)
        stop.wait(period)


def rss_bytes():
    """Resident memory of this process (VmRSS), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def table_rows(model_dir, since, timeout=30.0):
    """({table: rows summed over servers}, {"rss_bytes", "table_bytes"} summed over servers):
    locally this process's tables; distributed, the servers' status files written after
    ``since`` (Unix time). Blocks until every server's file is that fresh (bounded).

    Raises:
        SystemExit: a server's status is not fresh after ``timeout`` seconds (names it).
    """
    if fleet.is_local():
        rows = {name: len(table) for name, table in local_tables().items()}
        return rows, {"rss_bytes": rss_bytes(), "table_bytes": sum(t.memory_bytes() for t in local_tables().values())}
    rows, memory = {}, {"rss_bytes": 0, "table_bytes": 0}
    deadline = time.monotonic() + timeout
    for i in range(fleet.server_num()):
        path = os.path.join(model_dir, "servers", f"server-{i}.json")
        while True:
            try:
                with open(path) as f:
                    status = json.load(f)
                if status["time"] > since:
                    break
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"online.py: server {i}'s status {path} was not rewritten within {timeout:g} s "
                                 f"(a server writes it every --status_seconds)")
            time.sleep(0.05)
        for table, n in status["rows"].items():
            rows[table] = rows.get(table, 0) + n
        for key in memory:
            memory[key] += status[key]
    return rows, memory


# ------------------------------------------------------------------ the run
def build(args):
    """Builds the model, the test program and the optimizer; returns (inputs, loss, predict,
    test program)."""
    fleet.default_startup_program().random_seed = args.seed
    inputs, avg_cost, _, _, predict, _ = ctr_dnn_model(args.sparse_feature_dim, sparse_embedding=True,
                                                       entry=parse_entry(args.entry))
    test_program = fleet.default_main_program().clone(for_test=True)
    strategy = make_strategy(args)
    strategy.set_sparse_table_config(TABLE, show_click_decay_rate=args.show_click_decay_rate,
                                     delete_threshold=args.delete_threshold,
                                     delete_after_unseen_days=args.delete_after_unseen_days,
                                     base_threshold=args.base_threshold)
    fleet.distributed_optimizer(make_optimizer(args), strategy).minimize(avg_cost)
    return inputs, avg_cost, predict, test_program


def run_worker(args, inputs, avg_cost, predict, test_program):
    """Trains every pass not done yet, in order (each after its done file appears), saving
    after each one. Returns the executor (the caller stops the worker)."""
    os.makedirs(args.model_dir, exist_ok=True)
    progress = read_progress(args.model_dir)  # before the first barrier: no worker has moved on yet
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    if fleet.is_local() and progress["save"]:
        fleet.load_persistables(exe, os.path.join(args.model_dir, progress["save"]))
    dataset = fleet.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(inputs)
    dataset.set_data_format("criteo", hash_dim=args.sparse_feature_dim)
    dataset.set_batch_size(thread_batch_size(args))
    dataset.set_thread(args.threads)
    done, trained = set(progress["done"]), 0
    for day, index, name in schedule(args):
        if args.stop_after and trained == args.stop_after:
            break
        if name in done:
            if fleet.is_first_worker():
                print(f"pass {name}: done before this start (progress.json), skipped", flush=True)
                log_event(args.model_dir, event="skip", name=name)
            continue
        files = wait_for_pass(args, name, log=lambda m: print(m, flush=True))
        started = time.time()
        if fleet.is_first_worker():
            log_event(args.model_dir, event="start", name=name, day=day + 1, pass_index=index + 1)
        dataset.set_filelist(fleet.split_files(files))
        summary = exe.train_from_dataset(fleet.main_program, dataset, fetch_list=[avg_cost],
                                         fetch_info=["loss"], print_period=0)
        if not fleet.is_local():
            fleet.barrier_worker(args.barrier_timeout)  # every worker's updates of the pass are in before the save
        day_end = index == args.passes_per_day - 1
        deleted = None
        if args.shrink == "pass" or (args.shrink == "day" and day_end):
            deleted = sum(fleet.shrink().values())  # every worker calls it; the servers shrink once
        if fleet.is_first_worker():
            auc = evaluate(exe, test_program, inputs, predict,
                           sorted(glob.glob(os.path.join(args.data_dir, "test", name, "*"))), args.sparse_feature_dim)
            record = save_pass(exe, args, progress, name, day_end)
            record.update(day=day + 1, pass_index=index + 1, deleted=deleted, test_auc=auc,
                          examples=summary["examples"], seconds=round(time.time() - started, 3))
            log_event(args.model_dir, event="done", **record)
            print_pass(record)
        if not fleet.is_local():
            fleet.barrier_worker(args.barrier_timeout)  # the next pass starts from the saved state
        trained += 1
    return exe


def save_pass(exe, args, progress, name, day_end):
    """Saves the pass (a base when it starts a chain or ends a day, else a delta), then
    records it in progress.json. Returns {"name", "mode", "rows", "rss_bytes", "table_bytes"}."""
    mode = args.base_mode if progress["save"] is None or day_end else 1
    fleet.save_persistables(exe, os.path.join(args.model_dir, name), mode=mode)
    rows, memory = table_rows(args.model_dir, time.time())
    progress["done"].append(name)
    progress["save"] = name
    if mode != 1:
        progress["chain_start"] = name
    write_progress(args.model_dir, progress)  # the pass counts as done from here on
    return {"name": name, "mode": mode, "rows": rows, **memory}


def print_pass(record):
    rows = ", ".join(f"{t} {n:,}" for t, n in sorted(record["rows"].items()))
    auc, deleted, mode = record["test_auc"], record["deleted"], record["mode"]
    print(f"pass {record['name']} (day {record['day']} pass {record['pass_index']}): rows {rows}, "
          f"test auc {'n/a' if auc is None else f'{auc:.4f}'}, {record['seconds']:.1f} s, "
          f"saved {'delta' if mode == 1 else f'base (mode {mode})'}"
          + ("" if deleted is None else f" after shrink ({deleted:,} rows deleted)"), flush=True)


def serve(args, load_dir):
    """A server: loads ``load_dir`` (any save of a chain; None: starts empty), then serves
    until the workers stop, rewriting its status file meanwhile. Blocks."""
    fleet.init_server(load_dir)
    stop = threading.Event()
    threading.Thread(target=write_server_status, args=(args.model_dir, fleet.server_index(), args.status_seconds,
                                                       stop), daemon=True).start()
    try:
        fleet.run_server()
    finally:
        stop.set()


def main(argv=None):
    args = parse_args(argv)
    fleet.init(PaddleCloudRoleMaker())
    inputs, avg_cost, predict, test_program = build(args)
    if fleet.is_server():
        save = read_progress(args.model_dir)["save"]
        serve(args, os.path.join(args.model_dir, save) if save else None)
        return
    fleet.init_worker()
    try:
        run_worker(args, inputs, avg_cost, predict, test_program)
    finally:
        fleet.stop_worker()


if __name__ == "__main__":
    main()
