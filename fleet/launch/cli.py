"""The fleetrun command line: arguments -> `LaunchConfig` -> a job; its --help is the manual."""
from __future__ import annotations

import argparse
import os
import socket
import sys
import textwrap

from fleet.endpoints import parse_endpoint
from fleet.elastic import parse_np
from fleet.errors import ConfigError, FleetError
from fleet.launch.config import (DEFAULT_FAILURE_GRACE, EXIT_PROCESS_FAILED, EXIT_USAGE,
                                 LaunchConfig, _check_unique)
from fleet.launch import hosts as hosts_module
from fleet.launch.elastic import request_add_workers
from fleet.launch.etcd_launch import elastic_server, launch_with_etcd
from fleet.launch.from_args import keys_dir, make_config, make_keys
from fleet.launch.local import launch
from fleet.launch.hostfile import DEFAULT_REMOTE_DIR, parse_hosts
from fleet.launch.preflight import PREFLIGHT_SECONDS
from fleet.launch.report import say
from fleet.launch.this_host import place

_DESCRIPTION = """\
Start the parameter servers and workers of a fleet training script on this host,
stream worker 0's output, and stop everything when the job ends or any process fails.

Every process runs `python -u TRAINING_SCRIPT [ARGS]` with Paddle's role variables set,
so the script's PaddleCloudRoleMaker knows its role. When the endpoints name several
hosts, each host runs the same command and starts its own share (see below). With
--server_num 0 the script runs once with every role variable removed, which is local
training; its output goes to LOG_DIR/workerlog.0 and stdout as worker 0's would."""

_EPILOG = """\
environment of each process (everything else is passed through unchanged):
  TRAINING_ROLE                 PSERVER for a server, TRAINER for a worker
  PADDLE_PSERVERS_IP_PORT_LIST  all server endpoints, comma-separated host:port
  PADDLE_TRAINER_ENDPOINTS      all worker endpoints, comma-separated host:port
  PADDLE_TRAINERS_NUM           the number of workers
  PADDLE_TRAINER_ID             the worker's index, 0 .. workers-1 (removed for servers)
  POD_IP, PADDLE_PORT           host and port of the process's own endpoint
  FLEET_METRICS_PORT            with --metrics_port BASE: BASE+N for server N,
                                BASE+server_num+N for worker N
  PADDLE_TRAINING_ROLE, PADDLE_CURRENT_ENDPOINT and PADDLE_PSERVER_ID are removed.
  Local training (--server_num 0) removes all of the above.

logs:
  LOG_DIR/serverlog.N, LOG_DIR/workerlog.N  stdout+stderr of server N / worker N,
                                            rewritten on each run
  Worker 0's output is copied to fleetrun's stdout as it is written; fleetrun's own
  messages go to stderr and start with "fleetrun:".

how a job ends:
  When every worker has exited 0, the servers get --server_exit_timeout seconds to exit
  by themselves (they do once every worker has called fleet.stop_worker()); any still
  running then are terminated, and fleetrun says so and exits 0.
  When a process exits non-zero or is killed by a signal, fleetrun sees it at once and
  reports the first one (by time of exit) as the root cause: role, index, pid, exit
  code or signal, the error its log ends with and the last 20 lines of the log. The
  others then get --failure_grace seconds (default 3) to exit by themselves (a worker
  whose training failed tells the servers, and every process of the job then stops
  within about a heartbeat, its log saying what it saw); those still running are
  stopped (SIGTERM to each process group, SIGKILL after --kill_timeout), so survivors do
  not go on training and saving checkpoints. Failures after the root cause are listed
  as such, never as the cause. fleetrun exits 1.
  Ctrl-C or SIGTERM to fleetrun stops everything it started the same way (at once).
  Each process is stopped with its whole process group, so what it started goes too;
  on Linux, if fleetrun itself is killed (even by SIGKILL) its processes get SIGKILL.
  Last, fleetrun prints how every process ended, one line each: role, index, pid (and
  endpoint for a server), then "exited 0", "exited with code N", "was killed by SIGNAL"
  or "stopped by fleetrun (SIGTERM) after <why>", with the error its log ends with.
  A wait of fleetrun's own (servers lingering, the others after a failure) that lasts
  FLEET_WAIT_LOG_MS (default 5000 ms) says what it waits for, then again as it doubles.

exit codes:
  0              every worker exited 0
  1              a process failed (or could not be started); the report names it. With
                 --max_restarts K: the K-th restart failed too (every failure listed),
                 or the script makes no checkpoint (see --restart_from_scratch)
  2              bad arguments, a taken port, a missing script or an unusable log
                 directory; nothing was started
  124            --timeout expired; everything was stopped
  129, 130, 143  fleetrun got SIGHUP, SIGINT (Ctrl-C) or SIGTERM; everything was stopped

examples:
  fleetrun --server_num 2 --worker_num 2 train.py --epochs 3
  python -m fleet.launch --servers 127.0.0.1:6170,127.0.0.1:6171 --worker_num 2 train.py
  fleetrun --server_num 1 --worker_num 2 --start_port 6170 --log_dir logs train.py
  fleetrun --server_num 0 train.py        # local training: one process, no servers
  fleetrun --server_num 2 --worker_num 2 --max_restarts 2 train.py --checkpoint_dir ckpt
                                          # restart from the newest checkpoint on a failure
  fleetrun --np 2:4 --server_num 1 train.py --strategy async
                                          # elastic: 2 workers, up to 4 (--add_workers N)
  fleetrun --server_num 1 --worker_num 2 --metrics_port 9100 --live_summary 10 train.py
  fleetrun --collective --worker_num 4 train.py   # collective: 4 workers, no servers
  fleetrun --collective --workers 10.0.0.1:6170,10.0.0.2:6170 --keys_dir keys train.py
  fleetrun --make_keys keys               # once; copy keys/ to every host
  fleetrun --servers 10.0.0.1:6170,10.0.0.2:6170 --workers 10.0.0.1:6171,10.0.0.2:6171 \\
      --keys_dir keys train.py             # the same command on 10.0.0.1 and on 10.0.0.2
  fleetrun --hosts node1,node2,node3 --server_num_per_host 1 --worker_num_per_host 2 \\
      --dispatch . train.py --epochs 3     # from any machine, over ssh
  fleetrun --hosts node1,node2,node3 --collective --worker_num_per_host 2 \\
      --dispatch . train.py                # collective across hosts, over ssh
  fleetrun --elastic_server 10.0.0.9:2379 --job_id ctr1 --server_num 2 --worker_num 3 \\
      --server_num_per_host 1 --worker_num_per_host 1 --keys_dir keys train.py
                                           # the same on each host: ranks from etcd
  fleetrun --elastic_server 10.0.0.9:2379 --job_id ctr2 --np 2:4 --server_num 1 \\
      --server_num_per_host 0 --worker_num_per_host 2 --keys_dir keys train.py --strategy async
                                           # elastic across hosts: this host's 2 workers join
"""


def build_parser() -> argparse.ArgumentParser:
    """The fleetrun command line; its --help is the launcher's manual."""
    p = argparse.ArgumentParser(prog="fleetrun", description=_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server_num", type=int, metavar="N",
                   help="number of parameter servers (default: as many as --servers lists, "
                        "else 2); 0 means local training")
    p.add_argument("--worker_num", type=int, metavar="N",
                   help="number of workers (default: as many as --workers lists, else 2; "
                        "1 with --server_num 0)")
    p.add_argument("--collective", action="store_true",
                   help="collective training: workers only, no servers (default --worker_num 2); "
                        "each gets PaddleCloudRoleMaker(is_collective=True)'s variables "
                        "(PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, PADDLE_TRAINER_ID, "
                        "PADDLE_TRAINERS_NUM, PADDLE_TRAINING_ROLE=TRAINER)")
    p.add_argument("--servers", metavar="HOST:PORT,...",
                   help="server endpoints, comma-separated; each server binds its own")
    p.add_argument("--workers", metavar="HOST:PORT,...",
                   help="worker endpoints, comma-separated, exported as PADDLE_TRAINER_ENDPOINTS")
    p.add_argument("--start_port", type=int, metavar="PORT",
                   help="give servers, then workers, consecutive ports on 127.0.0.1 from PORT "
                        "(default: free ports picked by the system); a taken port is an error")
    p.add_argument("--log_dir", default="log", metavar="DIR",
                   help="directory of serverlog.N and workerlog.N (default: log)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="stop everything and exit 124 if the job runs longer (default: no limit)")
    p.add_argument("--server_exit_timeout", type=float, default=30.0, metavar="SECONDS",
                   help="after every worker exited 0, how long servers may take to exit by "
                        "themselves before they are terminated (default: 30)")
    p.add_argument("--kill_timeout", type=float, default=10.0, metavar="SECONDS",
                   help="when stopping a process, how long after SIGTERM to send SIGKILL "
                        "(default: 10)")
    p.add_argument("--failure_grace", type=float, metavar="SECONDS",
                   help="after a process fails, how long the others may take to exit by "
                        "themselves before they are stopped, so their logs say what they saw "
                        f"(default: {DEFAULT_FAILURE_GRACE:g}; 0: at once)")
    heal = p.add_argument_group(
        "restarting a failed job (--max_restarts)",
        textwrap.fill(
        "With --max_restarts K, when a process fails fleetrun stops every process of the job (as "
        "without it) and starts them all again, up to K times (Paddle's and torchrun's name). Each "
        "process gets FLEET_RESTART_COUNT (0, then 1..K) and FLEET_MAX_RESTARTS. A script that "
        "checkpoints with fleet.CheckpointConfig and resumes as fleet/checkpoint.py shows "
        "(servers: fleet.init_server(fleet.latest_checkpoint(DIR)); workers: "
        "fleet.load_checkpoint(exe, cfg) and train_from_dataset(..., checkpoint=cfg)) resumes "
        "from its newest valid checkpoint: parameters, optimizer state, step, epoch and each "
        "worker's place in its data; what was trained after that checkpoint is trained again. "
        "Each restart is said on stderr and appended to LOG_DIR/restarts.log with its cause "
        "(role, index, host, exit code or signal, the error line); an attempt's logs move to "
        "LOG_DIR/attempt-N/. fleetrun's last lines list every failure in order; it exits 0 when "
        "an attempt succeeds, 1 after the K-th restart failed too. On several hosts: with "
        "--hosts the dispatcher restarts every host together, after running the preflight again: "
        "a host that fails it (unreachable, ssh refused, ...) leaves the job for good and its "
        "servers and workers move to the other hosts (same totals and indexes, so the "
        "checkpoint loads unchanged; each move said and logged in restarts.log; the lost host "
        "is that attempt's failure); each per-host fleetrun given "
        "--max_restarts restarts its own processes when they fail, which they do on every "
        "host once any process of the job is lost (heartbeats), FLEET_HEARTBEAT_TIMEOUT_MS + "
        "--failure_grace + 2 s after its failure, when no old process is left on any host. "
        "With --np MIN:MAX a lost worker is the elastic job's (not a restart) and a lost server or "
        "fewer than MIN workers restarts the job; an elastic pass then resumes its epoch (server 0 "
        "restores the work units the checkpoint holds as trained). With --elastic_server a restart "
        "re-uses the plan formed in etcd (same ranks and endpoints); a lost host (lease expired, "
        "or its fleetrun left failing) starts a new round: every surviving host stops its "
        "processes, counts a restart and registers as ready, and once all are (within "
        "PADDLE_ELASTIC_TIMEOUT) the lost host's servers and workers move to the surviving hosts "
        "(servers to the server hosts with the fewest, workers likewise; each move said), the "
        "moved ranks on their new host's next free ports, and the job resumes from its newest "
        "checkpoint. "
        "docs/elastic.md says what survives what.", width=86))
    heal.add_argument("--max_restarts", "--max_restart", type=int, default=0, metavar="K",
                      help="restart the whole job up to K times after a failure (default: 0, the "
                           "first failure ends the job)")
    heal.add_argument("--restart_from_scratch", action="store_true",
                      help="with --max_restarts: restart even when the script makes no "
                           "fleet.CheckpointConfig (the job trains from the start again); without "
                           "it, such a job stops at its first failure saying how to checkpoint")
    elastic = p.add_argument_group(
        "elastic jobs: workers that come and go (async, half_async and geo strategies)",
        textwrap.fill(
        "With --np MIN:MAX (Paddle 2.x's elastic name) the job has MAX worker slots (ports) and starts "
        "--worker_num of them (default MIN); every process gets FLEET_ELASTIC=MIN:MAX and "
        "PADDLE_TRAINERS_NUM=MAX. A worker that dies is lost, not the job's failure: the servers forget it after "
        "FLEET_HEARTBEAT_TIMEOUT_MS and its unacknowledged work units go to the others (fleet.split_files gives "
        "every worker the whole list; train_from_dataset takes work units from server 0). The job fails, naming "
        "the lost workers, once fewer than MIN run before the data is done. Add workers to a running job with "
        "`fleetrun --add_workers N --log_dir DIR` or `kill -USR1 <fleetrun pid>` (one). Sync, collective and "
        "hybrid jobs cannot be elastic. With --elastic_server (and --server_num, no --worker_num) the MAX slots "
        "are keys in etcd: the job forms with its servers and at least MIN workers; a host of workers only that "
        "registers later takes free slots (up to its --worker_num_per_host) and starts joining workers; a lost host "
        "of workers only frees its slots (without --max_restarts a lost server host ends the job); below MIN live "
        "slots, with no worker done, every host ends the job; --add_workers on a host takes free slots from etcd. "
        "Its processes get no PADDLE_TRAINER_ENDPOINTS. With --max_restarts K a lost server host, a failed server "
        "or fewer than MIN live slots restarts the job from its newest checkpoint as a round: every surviving host "
        "stops, counts a restart and gets ready; the round's plan moves the lost hosts' servers and re-makes the "
        "worker slots (each host keeps its slot ids, up to --worker_num_per_host; a lost host's ids are free). "
        "See docs/elastic.md.", width=86))
    elastic.add_argument("--np", metavar="MIN:MAX",
                         help="make the job elastic: keep it running while at least MIN workers are alive, "
                              "admit up to MAX")
    elastic.add_argument("--worker_replacements", type=int, default=0, metavar="K",
                         help="with --np: restart up to K lost workers in total, each in its lost slot "
                              "(default 0: the others take over its share)")
    elastic.add_argument("--add_workers", type=int, metavar="N",
                         help="ask the elastic fleetrun whose --log_dir is given to start N more workers, "
                              "print which slots it started, and exit (no training script)")
    watch = p.add_argument_group(
        "watching a job (this host's processes; not with --hosts)",
        textwrap.fill(
        "With --metrics_port each process serves its counters (examples/s, pushes and pulls, bytes "
        "on the wire, send queue depths, staleness in steps, table rows and memory, heartbeat ages) "
        "in the Prometheus text format at http://HOST:PORT/metrics, HOST being its endpoint's host "
        "(every interface for local training and for servers binding 0.0.0.0), from fleet.init() "
        "on; point Prometheus at them, or let --live_summary print them. The metric names are in "
        "docs/env.md (FLEET_METRICS_PORT).", width=86))
    watch.add_argument("--metrics_port", type=int, metavar="BASE",
                       help="serve each process's metrics: server i on port BASE+i, worker j on "
                            "BASE+server_num+j, on the process's own host (sets FLEET_METRICS_PORT; "
                            "a taken port is an error naming it)")
    watch.add_argument("--live_summary", type=float, metavar="SECONDS",
                       help="every SECONDS print one line on stderr about this host's processes, read "
                            "from their metrics (needs --metrics_port), e.g. \"fleetrun: workers 2: "
                            "41,200 ex/s, 38 push/s, 40 pull/s, lag 1.2 steps; servers 1: 80 req/s, 1.2M "
                            "rows, 180 MB\", naming any process that did not answer")
    hosts = p.add_argument_group(
        "one job on several hosts (run the same command on each host)",
        "When --servers/--workers name several hosts, fleetrun starts on this host only the "
        "processes whose endpoint host is one of its addresses (every interface's, or "
        "--nic's, or --host's), with the job-wide indexes. The job is encrypted (CURVE) unless "
        "--insecure is given: make keys once with --make_keys DIR, copy DIR to every host, and "
        "give --keys_dir DIR (or set FLEET_CURVE_KEYS_DIR).")
    hosts.add_argument("--host", metavar="ADDR",
                       help="this host's address as the endpoints name it (default: POD_IP if "
                            "set, else the addresses of this host's interfaces); an address "
                            "not on an interface here is advertised while the processes bind 0.0.0.0")
    hosts.add_argument("--nic", metavar="NAME",
                       help="match endpoints against this interface's addresses only (default: "
                            "PADDLE_NIC if set, else every interface)")
    hosts.add_argument("--keys_dir", metavar="DIR",
                       help="CURVE key directory every process uses (FLEET_CURVE_KEYS_DIR)")
    hosts.add_argument("--insecure", action="store_true",
                       help="run a multi-host job without CURVE: anyone on the network can "
                            "read and push updates")
    hosts.add_argument("--make_keys", metavar="DIR",
                       help="write a new CURVE key directory (owner-only files) and exit")
    hosts.add_argument("--stop_on_stdin_eof", action="store_true",
                       help="stop every process when fleetrun's standard input closes (used "
                            "by a dispatching fleetrun over ssh)")
    hosts.add_argument("--result_json", metavar="PATH",
                       help="at the end, write how the job ended here as JSON to PATH")
    ssh = p.add_argument_group(
        "one job on many hosts over ssh, from any machine (--hosts)",
        textwrap.fill(
        "fleetrun --hosts checks every host over ssh (python, fleet, the workspace; at most "
        f"{PREFLIGHT_SECONDS:g} s, nothing starts unless every host passes), copies "
        "the workspace, runs the per-host fleetrun on each host with --stop_on_stdin_eof, "
        "streams worker 0's output, prefixes each host's messages with [host], ends every "
        "process on every host when one fails or on Ctrl-C, and fetches each host's logs into "
        "LOG_DIR/<host>/. It uses the system's ssh (your ~/.ssh/config, agent and known_hosts) "
        "with BatchMode. Host i's servers get ports START_PORT.. (default 6170) and its workers "
        "the next ones; with --collective there are no servers and each host runs the per-host "
        "fleetrun --collective. The job is encrypted: the job's CURVE keys go with the workspace "
        "(.fleet_keys/, owner-only) unless --insecure. --nic NAME makes each host's endpoints "
        "the address of its interface NAME instead of the host as written.", width=86))
    ssh.add_argument("--hosts", metavar="HOSTFILE|H1,H2,...",
                     help="the hosts, each [user@]host[:sshport]: a comma list, or a file with "
                          "one per line (# comments), where a line may add servers=N and/or "
                          "workers=M for that host; the first host with workers runs worker 0")
    ssh.add_argument("--server_num_per_host", type=int, metavar="S",
                     help="servers on each host without servers=N on its hostfile line (default: 1; "
                          "none with --collective)")
    ssh.add_argument("--worker_num_per_host", type=int, default=1, metavar="W",
                     help="workers on each host without workers=M on its hostfile line (default: 1)")
    ssh.add_argument("--dispatch", metavar="DIR",
                     help="copy this local directory to every host (rsync: only what changed; "
                          "scp -r if rsync is missing) and run there; the script path is "
                          "relative to it")
    ssh.add_argument("--workspace", metavar="DIR",
                     help="a directory already on every host (shared filesystem, earlier copy) "
                          "to run in; the script path is relative to it")
    ssh.add_argument("--remote_dir", default=DEFAULT_REMOTE_DIR, metavar="PATH",
                     help="where --dispatch copies to on each host; {name} is DIR's base name, "
                          "{host} the host's name, ~ the remote home (default: "
                          "~/fleet_jobs/{name})")
    ssh.add_argument("--python", default=sys.executable, metavar="PATH",
                     help="the python with fleet on every host (default: this fleetrun's "
                          f"python, {sys.executable})")
    ssh.add_argument("--ssh_config", metavar="FILE",
                     help="an ssh_config file for ssh, scp and rsync (ssh -F FILE; default: "
                          "~/.ssh/config)")
    ssh.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="set a variable for every remote process (repeatable); FLEET_*, "
                          "FLAGS_*, PYTHON*, NUMBA_*, CPU_NUM and the BLAS thread counts of "
                          "this environment are passed on anyway")
    etcd = p.add_argument_group(
        "one job on several hosts through etcd (--elastic_server), no lists",
        textwrap.fill(
        "Run the same fleetrun on each host with --elastic_server and --job_id. Each host "
        "registers itself under the job in etcd (a key with a lease of PADDLE_ELASTIC_TTL s, "
        "default 10, kept alive), offering --server_num_per_host servers (default 1, 0 with "
        "--collective) and --worker_num_per_host workers (default 1) on its address (--host, "
        "POD_IP, --nic's, else the one on its route to etcd) at ports START_PORT.. (default "
        "6170), and waits (at most PADDLE_ELASTIC_TIMEOUT s, default 120) until the hosts offer "
        "the job's --server_num servers and --worker_num workers. Ranks follow the order the hosts "
        "registered in; every host reads the same plan from etcd and starts its share as with "
        "--servers/--workers lists. A host lost while the job runs ends the job, naming it; a "
        "host arriving after the job formed is refused (with --np MIN:MAX a host of workers only "
        "joins in free worker slots, and losing one does not end the job). Training never talks to etcd: if etcd "
        "goes away, the job trains on, and a failure then names etcd's endpoint too. Each call "
        "to etcd waits at most FLEET_ETCD_TIMEOUT_MS (default 5000). See docs/elastic.md.",
        width=86))
    etcd.add_argument("--elastic_server", metavar="HOST:PORT",
                      help="etcd's client address (default: PADDLE_ELASTIC_SERVER)")
    etcd.add_argument("--job_id", metavar="ID",
                      help="the job's name in etcd; hosts with the same ID form one job "
                           "(default: PADDLE_ELASTIC_JOB_ID)")
    p.add_argument("training_script", nargs="?", help="the Python script every process runs")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER,
                   help="arguments given to the script")
    return p


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Turn parsed fleetrun arguments into a LaunchConfig, choosing ports.

    Args:
        args: the namespace from :func:`build_parser`.

    Returns:
        The frozen config, every endpoint concrete.

    Raises:
        ConfigError: arguments contradict each other or are out of range.
    """
    if not args.training_script:
        raise ConfigError("no training script: give the path of the Python script to run "
                          "(fleetrun [options] train.py [args])")
    servers = _split_endpoints(args.servers, "--servers")
    workers = _split_endpoints(args.workers, "--workers")
    if args.collective:
        if servers or args.server_num:
            raise ConfigError(f"--collective trains without servers; leave out "
                              f"{'--servers' if servers else f'--server_num {args.server_num}'} (or drop "
                              f"--collective and use DistributedStrategyFactory.create_hybrid_strategy() to keep "
                              f"tables on servers)")
        servers = []
    server_num = _count(args.server_num, servers, "--server_num", "--servers", default=2)
    if args.np is not None:
        return _elastic_config(args, servers, workers, server_num)
    if args.worker_replacements:
        raise ConfigError(f"--worker_replacements {args.worker_replacements} is for elastic jobs: give --np MIN:MAX")
    worker_num = _count(args.worker_num, workers, "--worker_num", "--workers",
                        default=2 if server_num or args.collective else 1)
    if server_num == 0 and not args.collective:
        if worker_num != 1 or workers:
            raise ConfigError(f"--worker_num {worker_num} with --server_num 0: without servers "
                              "fleetrun runs the script once, for local training; give "
                              "--server_num 1 or more to train with several workers")
        return make_config(args, (), ())
    if worker_num < 1:
        raise ConfigError(f"--worker_num {worker_num}: "
                          f"{'a collective job needs' if args.collective else 'servers need'} at least one "
                          "worker; give --worker_num 1 or more")
    servers, workers = _local_endpoints(servers, workers, server_num, worker_num, args.start_port)
    _check_unique(servers, workers)
    host, source = args.host, "--host"
    if host is None and os.environ.get("POD_IP", "").strip():
        host, source = os.environ["POD_IP"].strip(), "POD_IP"
    nic = args.nic or os.environ.get("PADDLE_NIC", "").strip() or None
    placement = place(servers, workers, host=host, host_source=source, nic=nic)
    if placement.whole_job:
        return make_config(args, servers, workers, keys_dir=keys_dir(args, False))
    return make_config(args, servers, workers, local_servers=placement.servers,
                        local_workers=placement.workers, bind_any=placement.bind_any,
                        bind_any_workers=placement.bind_any_workers,
                        host=placement.name,
                        keys_dir=keys_dir(args, True))


def _elastic_config(args, servers, workers, server_num):
    """The LaunchConfig of ``--np MIN:MAX``: MAX worker slots, --worker_num of them started."""
    low, high = parse_np(args.np)
    if args.collective or server_num == 0:
        raise ConfigError(f"--np {args.np} makes a parameter-server job elastic: give --server_num 1 or more, "
                          f"without --collective")
    if workers is not None and len(workers) != high:
        raise ConfigError(f"--workers lists {len(workers)} endpoints, but --np {args.np} needs one per slot: "
                          f"{high}")
    initial = low if args.worker_num is None else args.worker_num
    servers, workers = _local_endpoints(servers, workers, server_num, high, args.start_port)
    _check_unique(servers, workers)
    placement = place(servers, workers, host=args.host, host_source="--host", nic=args.nic)
    if not placement.whole_job:
        raise ConfigError(f"--np {args.np} runs every worker slot on this host, but the endpoints name other "
                          f"hosts: run an elastic job on one host (docs/elastic.md)")
    return make_config(args, servers, workers, keys_dir=keys_dir(args, False), elastic=(low, high),
                        initial_workers=initial, worker_replacements=args.worker_replacements)


def _split_endpoints(text, option):
    if text is None:
        return None
    endpoints = [e.strip() for e in text.split(",")]
    for e in endpoints:
        parse_endpoint(e, f"{option} entry")
    return endpoints


def _count(number, endpoints, num_option, list_option, default):
    if endpoints is not None:
        if number is not None and number != len(endpoints):
            raise ConfigError(f"{num_option} {number} does not match {list_option}, which lists "
                              f"{len(endpoints)} endpoints; give only one of them or make them agree")
        return len(endpoints)
    if number is None:
        return default
    if number < 0:
        raise ConfigError(f"{num_option} {number} is negative; give a count of 0 or more")
    return number


def _local_endpoints(servers, workers, server_num, worker_num, start_port):
    """(servers, workers) as tuples: the given lists, or loopback endpoints on free ports
    (from ``start_port``) for ``server_num`` servers and ``worker_num`` workers where None."""
    ports = _choose_ports((0 if servers else server_num) + (0 if workers else worker_num), start_port)
    if servers is None:
        servers, ports = [f"127.0.0.1:{p}" for p in ports[:server_num]], ports[server_num:]
    if workers is None:
        workers = [f"127.0.0.1:{p}" for p in ports[:worker_num]]
    return tuple(servers), tuple(workers)


def _choose_ports(count, start_port):
    if start_port is None:
        return _pick_free_ports(count)
    if not 1 <= start_port <= 65536 - count:
        raise ConfigError(f"--start_port {start_port} leaves no room for {count} consecutive "
                          f"ports; give a port in 1..{65536 - count}")
    return list(range(start_port, start_port + count))


def _pick_free_ports(count):
    # Hold every socket until all are bound so the ports are distinct.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_PER_HOST_ONLY = ("servers", "workers", "server_num", "worker_num", "np", "host", "keys_dir",
                  "stop_on_stdin_eof", "result_json")
_HOSTS_ONLY = ("dispatch", "workspace", "env")


def hosts_config_from_args(args: argparse.Namespace) -> hosts_module.HostsConfig:
    """Turn parsed fleetrun --hosts arguments into a HostsConfig.

    Raises:
        ConfigError: an option that belongs to a one-host run is given, or a value is bad.
    """
    if args.np is not None:
        raise ConfigError(f"--np {args.np} cannot be used with --hosts: the dispatcher runs a fixed "
                          "set of workers on its hosts (with --max_restarts a lost host's ranks move "
                          "to the others). For workers that come and go across hosts run the same "
                          "fleetrun on each host with --elastic_server HOST:PORT --job_id ID; for "
                          "an elastic job on one host, fleetrun --np MIN:MAX there (docs/elastic.md)")
    given = [f"--{name}" for name in _PER_HOST_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise ConfigError(f"{', '.join(given)} cannot be used with --hosts: the dispatcher "
                          "computes every endpoint (--server_num_per_host, "
                          "--worker_num_per_host, --start_port) and makes the job's keys")
    if not args.training_script:
        raise ConfigError("no training script: give its path relative to the workspace "
                          "(fleetrun --hosts ... train.py [args])")
    return hosts_module.HostsConfig(
        hosts=parse_hosts(args.hosts), training_script=args.training_script,
        script_args=tuple(args.training_script_args),
        server_num_per_host=(0 if args.collective else 1) if args.server_num_per_host is None
        else args.server_num_per_host, collective=args.collective,
        worker_num_per_host=args.worker_num_per_host, dispatch=args.dispatch,
        workspace=args.workspace, remote_dir=args.remote_dir, python=args.python,
        ssh_config=args.ssh_config, nic=args.nic,
        start_port=6170 if args.start_port is None else args.start_port,
        insecure=args.insecure, log_dir=args.log_dir, env=tuple(args.env),
        kill_timeout=args.kill_timeout, server_exit_timeout=args.server_exit_timeout,
        failure_grace=args.failure_grace, timeout=args.timeout, max_restarts=args.max_restarts,
        restart_from_scratch=args.restart_from_scratch)


def _check_no_watch_options(args):
    given = [f"--{name}" for name in ("metrics_port", "live_summary") if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"{' and '.join(given)} work with the per-host fleetrun, not with --hosts: run "
                          "the same fleetrun --servers ... --workers ... command on each host (docs/clusters.md) "
                          "with --metrics_port BASE to watch the job")


def _check_no_hosts_options(args, elastic=False):
    given = [f"--{name}" for name in _HOSTS_ONLY if getattr(args, name)]
    if not elastic and (args.server_num_per_host is not None or args.worker_num_per_host != 1):
        given.append("--server_num_per_host/--worker_num_per_host")
    if given:
        raise ConfigError(f"{', '.join(given)} only work with --hosts (a job on several hosts "
                          "over ssh){' or --elastic_server' if not elastic else ''}; give --hosts "
                          "H1,H2,... or leave them out")


def main(argv=None) -> None:
    """Entry point of ``fleetrun`` and ``python -m fleet.launch``: exits with launch's code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.make_keys:
            make_keys(args.make_keys)
            say(f"wrote CURVE keys to {args.make_keys} (owner-only); copy the directory to "
                f"every host of the job and give fleetrun --keys_dir {args.make_keys}")
            sys.exit(0)
        if args.add_workers is not None:
            result = request_add_workers(args.log_dir, args.add_workers)
            say(f"the job's fleetrun started worker{'s' if len(result['admitted']) != 1 else ''} "
                f"{', '.join(map(str, result['admitted'])) or 'none'}"
                + (f"; refused {result['refused']}: {result['why']}" if result["refused"] else ""))
            sys.exit(0 if not result["refused"] else EXIT_PROCESS_FAILED)
        if args.hosts is not None:
            _check_no_watch_options(args)
            if args.elastic_server:
                raise ConfigError("--hosts and --elastic_server are two ways to start a job on "
                                  "several hosts; give one of them")
            code = hosts_module.run_hosts(hosts_config_from_args(args))
        elif elastic_server(args):
            _check_no_hosts_options(args, elastic=True)
            code = launch_with_etcd(args)
        else:
            _check_no_hosts_options(args)
            code = launch(config_from_args(args))
    except ConfigError as e:
        say(f"error: {e}")
        code = EXIT_USAGE
    except FleetError as e:
        say(f"error: {e}")
        code = EXIT_PROCESS_FAILED
    sys.exit(code)
