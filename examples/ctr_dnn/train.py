"""Trains CTR-DNN with fleet: the same script runs locally, or as a server or a worker.

Locally:      python train.py --data_dir data
Distributed:  fleetrun --server_num 1 --worker_num 2 train.py --data_dir data --strategy async
Collective:   fleetrun --collective --worker_num 2 train.py --data_dir data --strategy collective
Hybrid:       fleetrun --server_num 1 --worker_num 2 train.py --data_dir data --strategy hybrid
With mpirun:  mpirun -np 4 python train.py --role_maker mpi --data_dir data --strategy sync
              (even ranks servers, odd ranks workers; needs pip install fleet[mpi])

Each worker trains on its share of the train files (``fleet.split_files``), the first
worker saves the model after every epoch to ``<model_dir>/epoch_N`` and appends a JSON
line every 2 seconds of training to ``<model_dir>/metrics.jsonl`` (time, epoch, loss,
auc), plus one per epoch with the job's figures (global_auc, loss, examples, workers).

Each worker ends every epoch with a line ``epoch N: <examples> examples, <rate> examples/s,
train auc <auc>, pass <start>-<end> (Unix time)``: the pass's wall-clock span lets a
benchmark time a job across workers that did not start at the same moment. Then every
worker merges its AUC buckets with the others' (``fleet.metrics.auc``, a collective call)
and the first worker prints ``epoch N: global auc <auc> over <W> workers``: the AUC of the
epoch's training predictions of every worker together. The AUC states are zeroed at the
start of each epoch, so both AUCs are the epoch's own.

With ``--checkpoint_dir DIR`` the first worker checkpoints every ``--checkpoint_steps``
batches and/or ``--checkpoint_seconds`` seconds (``fleet.CheckpointConfig``), and a
restarted job resumes from the newest valid checkpoint there (servers load it, workers
resume step, epoch and their place in their files): run it under ``fleetrun
--max_restarts K`` and a failed job restarts by itself (README.md shows it).
"""
import argparse
import glob
import json
import os
import time

import numpy as np

import fleet
from fleet import optimizer
from network import ctr_dnn_model
from role_makers import MPISymetricRoleMaker, PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", default="data", help="holds train/ (and test/) with Criteo-format files")
    p.add_argument("--model_dir", default="output", help="where models and metrics.jsonl go")
    p.add_argument("--role_maker", default="paddle_cloud", choices=["paddle_cloud", "mpi"],
                   help="paddle_cloud: the role from Paddle's environment variables (fleetrun sets them; unset: "
                        "local training); mpi: under mpirun -np 2N, even ranks servers and odd ranks workers")
    p.add_argument("--strategy", default="async", choices=["sync", "async", "half_async", "geo", "hybrid",
                                                             "collective"],
                   help="collective: no servers (fleetrun --collective); hybrid: dense all-reduced among "
                        "the workers, tables on the servers")
    p.add_argument("--geo_k", type=int, default=100, help="GEO update frequency (steps between exchanges)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=1000,
                   help="examples per parameter update (default 1000). Each thread reads batch_size divided "
                        "by what one update averages: sync, hybrid and collective workers x threads, half-async "
                        "threads (x pushes merged), async pushes merged (1 by default), GEO workers (their "
                        "progress is averaged)")
    p.add_argument("--batch_per_thread", type=int, default=None,
                   help="every training thread reads this many examples per step in every strategy, as "
                        "dataset.set_batch_size does in Paddle 1.x (an update then averages as many batches as "
                        "the strategy merges: sync, hybrid and collective workers x threads); replaces "
                        "--batch_size's division")
    p.add_argument("--threads", type=int, default=2, help="training threads per worker")
    p.add_argument("--merge_pushes", type=int, default=1,
                   help="async / half-async: servers average this many pushes into one update (1: each on "
                        "arrival, Paddle's async; 0: one per worker still training); each thread then reads "
                        "batch_size / pushes merged. Hybrid servers merge one push per worker (its default)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adagrad"])
    p.add_argument("--sparse_feature_dim", type=int, default=1000001)
    p.add_argument("--print_period", type=int, default=50, help="batches between progress lines (0: none)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint_dir", default=None,
                   help="checkpoint into DIR and resume from its newest valid checkpoint (default: none)")
    p.add_argument("--checkpoint_steps", type=int, default=None,
                   help="with --checkpoint_dir: checkpoint every N batches of the first worker")
    p.add_argument("--checkpoint_seconds", type=float, default=None,
                   help="with --checkpoint_dir: checkpoint every S seconds (default 60 when neither "
                        "--checkpoint_steps nor this is given)")
    p.add_argument("--checkpoint_keep", type=int, default=2, help="newest checkpoints kept (default 2)")
    args = p.parse_args(argv)
    if args.checkpoint_dir is None and (args.checkpoint_steps or args.checkpoint_seconds):
        p.error("--checkpoint_steps / --checkpoint_seconds need --checkpoint_dir DIR")
    if args.checkpoint_dir and not (args.checkpoint_steps or args.checkpoint_seconds):
        args.checkpoint_seconds = 60.0
    return args


def make_checkpoint_config(args):
    """The job's fleet.CheckpointConfig, or None without --checkpoint_dir."""
    if not args.checkpoint_dir:
        return None
    return fleet.CheckpointConfig(args.checkpoint_dir, step_interval=args.checkpoint_steps,
                                  seconds_interval=args.checkpoint_seconds,
                                  max_num_checkpoints=args.checkpoint_keep)


def make_strategy(args):
    if args.strategy == "geo":
        return DistributedStrategyFactory.create_geo_strategy(update_frequency=args.geo_k)
    strategy = getattr(DistributedStrategyFactory, f"create_{args.strategy}_strategy")()
    if args.strategy in ("async", "half_async"):
        strategy.get_program_config().merge_async_pushes = args.merge_pushes
    return strategy


def make_optimizer(args):
    if args.optimizer == "sgd":
        return optimizer.SGD(args.lr)
    if args.optimizer == "adagrad":
        return optimizer.Adagrad(args.lr)
    return optimizer.Adam(args.lr, lazy_mode=True)


class MetricsLog(fleet.FetchHandler):
    """Writes a JSON line of the latest fetched values every period."""

    def __init__(self, path, var_dict, epoch, period_secs=2.0):
        super().__init__(var_dict, period_secs)
        self.path, self.epoch, self.start = path, epoch, time.time()

    def handler(self, res_dict):
        with open(self.path, "a") as f:
            f.write(json.dumps({"time": round(time.time() - self.start, 3), "epoch": self.epoch,
                                **{k: float(v.reshape(-1)[0]) for k, v in res_dict.items()}}) + "\n")


def thread_batch_size(args):
    """Each training thread's batch: ``--batch_size`` examples per parameter update. Sync
    averages the batches of every thread of every worker into one update, half-async the
    batches of a worker's threads (and async / half-async servers with --merge_pushes the
    pushes of several workers), GEO averages the workers' progress: so there each thread
    reads its share and the run makes as many updates of the same size as local training."""
    per_thread = getattr(args, "batch_per_thread", None)  # online.py's options have none
    if per_thread is not None:
        if per_thread < 1:
            raise SystemExit(f"--batch_per_thread {per_thread}: give at least 1 example")
        return per_thread
    if fleet.is_local():
        return args.batch_size
    merged = args.merge_pushes or fleet.worker_num()  # pushes one async update averages
    # GEO servers average the workers' progress (each sends its change / workers), so
    # as in sync, workers x batch examples make one step's worth of progress.
    # Collective and hybrid average every thread of every worker into one update, as sync
    # (hybrid servers merge one push per worker into one update of the tables).
    share = {"sync": args.threads * fleet.worker_num(), "half_async": args.threads * merged,
             "async": merged, "geo": fleet.worker_num(), "hybrid": args.threads * fleet.worker_num(),
             "collective": args.threads * fleet.worker_num()}[args.strategy]
    if share == 1:
        return args.batch_size
    if args.batch_size < share:
        raise SystemExit(f"--batch_size {args.batch_size} is smaller than the {share} threads whose batches "
                         f"one {args.strategy} update averages: it needs at least one example per thread")
    return args.batch_size // share


def job_metrics(summary, auc_states):
    """The epoch's figures over every worker (collective calls: every worker calls this).

    Returns:
        {"global_auc": AUC of every worker's predictions of the epoch together (their
        buckets merged), "loss": the mean over workers of each one's last batch loss,
        "examples": examples trained by all workers, "workers": how many took part (in an
        elastic job, fleetrun --np, the workers still training)}.
    """
    _, _, stat_pos, stat_neg = auc_states
    global_auc = fleet.metrics.auc(stat_pos, stat_neg)
    loss = summary["fetch"].get("loss")  # none when the other workers trained the whole pass (elastic)
    # or after a resume that found the epoch trained already
    last_loss = float(loss.reshape(-1)[0]) if loss is not None else 0.0
    loss, examples, workers, with_loss = fleet.metrics.sum(
        np.array([last_loss, summary["examples"], 1, loss is not None], dtype=np.float64))
    return {"global_auc": global_auc, "loss": loss / max(with_loss, 1), "examples": int(examples),
            "workers": int(workers)}


def main(argv=None):
    args = parse_args(argv)
    collective = args.strategy == "collective" and "PADDLE_TRAINER_ENDPOINTS" in os.environ  # else: local
    fleet.init(MPISymetricRoleMaker() if args.role_maker == "mpi" else PaddleCloudRoleMaker(is_collective=collective))
    fleet.default_startup_program().random_seed = args.seed
    inputs, avg_cost, auc, batch_auc, _, auc_states = ctr_dnn_model(args.sparse_feature_dim)
    fleet.distributed_optimizer(make_optimizer(args), make_strategy(args)).minimize(avg_cost)

    cfg = make_checkpoint_config(args)
    if fleet.is_server():
        fleet.init_server(fleet.latest_checkpoint(args.checkpoint_dir) if cfg else None)  # None: fresh start
        fleet.run_server()
        return
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    resumed = fleet.load_checkpoint(exe, cfg) if cfg else None
    if resumed and fleet.is_first_worker():
        print(f"resumed from {resumed}: epoch {cfg.epoch}, step {cfg.global_step} (restart "
              f"{os.environ.get('FLEET_RESTART_COUNT', '0')})", flush=True)
    files = sorted(glob.glob(os.path.join(args.data_dir, "train", "*")))
    if not files:
        raise SystemExit(f"no train files in {args.data_dir}/train: run generate_data.py first")
    my_files = fleet.split_files(files)
    dataset = fleet.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(inputs)
    dataset.set_data_format("criteo", hash_dim=args.sparse_feature_dim)
    batch_size = thread_batch_size(args)
    if batch_size != args.batch_size and fleet.is_first_worker():
        print(f"{args.strategy}: each thread reads batch {batch_size} of the {args.batch_size} examples "
              f"one update averages", flush=True)
    dataset.set_batch_size(batch_size)
    dataset.set_thread(args.threads)
    dataset.set_filelist(my_files)
    os.makedirs(args.model_dir, exist_ok=True)
    metrics = os.path.join(args.model_dir, "metrics.jsonl")
    scope = fleet.global_scope()
    for epoch in range(cfg.epoch if cfg else 0, args.epochs):
        # A resumed epoch keeps the AUC states the checkpoint had (an elastic pass resumes too:
        # server 0 restores the work units the checkpoint holds).
        if not (resumed and cfg.epoch_step):
            for state in auc_states:  # the epoch's AUC, not the run's so far
                scope[state.name][...] = 0
        resumed = None
        handler = MetricsLog(metrics, {"loss": avg_cost, "auc": auc}, epoch) if fleet.is_first_worker() else None
        started = time.time()
        summary = exe.train_from_dataset(fleet.main_program, dataset, fetch_list=[avg_cost, auc],
                                         fetch_info=["loss", "auc"], print_period=args.print_period,
                                         fetch_handler=handler, checkpoint=cfg)
        print(f"epoch {epoch}: {summary['examples']} examples, {summary['examples_per_sec']:,.0f} examples/s, "
              f"train auc {float(summary['fetch'].get('auc', [float('nan')])[0]):.4f}, "
              f"pass {started:.3f}-{time.time():.3f} (Unix time)", flush=True)
        job = job_metrics(summary, auc_states)  # every worker takes part
        if fleet.is_first_worker():
            workers = job["workers"]
            print(f"epoch {epoch}: global auc {job['global_auc']:.4f} over {workers} "
                  f"worker{'s' if workers > 1 else ''}", flush=True)
        if not fleet.is_local():  # the saved model holds every worker's updates of this epoch
            fleet.barrier_worker()
        if fleet.is_first_worker():
            with open(metrics, "a") as f:
                f.write(json.dumps({"epoch": epoch, "examples_per_sec": summary["examples_per_sec"], **job,
                                    "final": True}) + "\n")
            fleet.save_persistables(exe, os.path.join(args.model_dir, f"epoch_{epoch}"))
    fleet.stop_worker()


if __name__ == "__main__":
    main()
