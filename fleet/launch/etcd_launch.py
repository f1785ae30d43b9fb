"""fleetrun --elastic_server: this host's share of a job whose hosts meet in etcd.

- :func:`rendezvous_from_args`: the parsed arguments -> this host's Rendezvous (after checking
  the options that go with it);
- :func:`launch_with_etcd`: rendezvous, then run this host's servers and workers, with a new
  round on a lost host under --max_restarts (fleet.launch.etcd_rounds);
- an elastic job (--np) takes worker slots bound to its lease (fleet.launch.etcd_slots), and
  rounds re-make them (fleet.launch.etcd_slot_rounds).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket

from fleet.endpoints import parse_endpoint
from fleet.elastic import parse_np
from fleet.envvars import env_int
from fleet.errors import ConfigError, RendezvousError
from fleet.launch import etcd_rendezvous as rdv_module
from fleet.launch import etcd_slots as slots_module
from fleet.launch.config import EXIT_PROCESS_FAILED
from fleet.launch.etcd_rounds import Regroup
from fleet.launch.etcd_slot_rounds import SlotRegroup, join_newest_round
from fleet.launch.from_args import keys_dir, make_config
from fleet.launch.local import launch
from fleet.launch.report import plural, say
from fleet.launch.this_host import interface_addresses, place


def elastic_server(args):
    """--elastic_server, else $PADDLE_ELASTIC_SERVER, else None."""
    return args.elastic_server or os.environ.get(rdv_module.SERVER_ENV, "").strip() or None


def rendezvous_from_args(args: argparse.Namespace) -> rdv_module.Rendezvous:
    """Turn parsed fleetrun --elastic_server arguments into this host's Rendezvous.

    Raises:
        ConfigError: an option contradicts the rendezvous, or a count is missing or bad.
        RendezvousError: this host has no route to etcd (to find its own address).
    """
    server = elastic_server(args)
    job_id = args.job_id or os.environ.get(rdv_module.JOB_ID_ENV, "").strip()
    if args.servers or args.workers:
        raise ConfigError("--servers/--workers with --elastic_server: etcd hands out the "
                          "endpoints; give the job's totals (--server_num N --worker_num M) and "
                          "this host's share (--server_num_per_host, --worker_num_per_host)")
    elastic = _elastic_etcd_np(args)
    if not job_id:
        raise ConfigError(f"--elastic_server {server} needs --job_id ID (or {rdv_module.JOB_ID_ENV}): "
                          "the name under which this job's hosts meet in etcd")
    if "/" in job_id:
        raise ConfigError(f"--job_id {job_id!r} contains '/'; give a name without it")
    if not args.training_script:
        raise ConfigError("no training script: give the path of the Python script to run "
                          "(fleetrun [options] train.py [args])")
    server_num = 0 if args.collective else args.server_num
    worker_num = args.worker_num if elastic is None else elastic[1]
    if server_num is None or worker_num is None:
        raise ConfigError("--elastic_server needs the job's totals, the same on every host: "
                          "--server_num N --worker_num M (the job forms when its hosts offer "
                          "that many)")
    per_s = 0 if args.collective else (1 if args.server_num_per_host is None else args.server_num_per_host)
    per_w = args.worker_num_per_host
    for name, value, total in (("--server_num_per_host", per_s, server_num),
                               ("--worker_num_per_host", per_w, worker_num)):
        if not 0 <= value <= total:
            raise ConfigError(f"{name} {value} must be in 0..{total} (the job's total)")
    if per_s + per_w == 0:
        raise ConfigError("--server_num_per_host 0 and --worker_num_per_host 0: this host would "
                          "run nothing; give it at least one server or worker")
    if server_num == 0 and not args.collective:
        raise ConfigError("--server_num 0 with --elastic_server: local training needs no "
                          "rendezvous; give --server_num 1 or more (or --collective)")
    keys_dir(args, elastic is not None or (per_s, per_w) != (server_num, worker_num))
    addr, source = _elastic_host(args, server)
    servers, workers = rdv_module.host_endpoints(addr, per_s, per_w,
                                                 6170 if args.start_port is None else args.start_port)
    me = rdv_module.HostRecord(addr, servers, workers, socket.gethostname())
    client = rdv_module.EtcdClient(server, rdv_module.call_timeout_s())
    ttl = env_int(rdv_module.TTL_ENV, rdv_module.DEFAULT_TTL_S, low=1,
                  meaning="the seconds of a host's lease in etcd")
    wait_s = env_int(rdv_module.TIMEOUT_ENV, rdv_module.DEFAULT_TIMEOUT_S, low=1,
                     meaning="the seconds to wait for the job's hosts")
    return rdv_module.Rendezvous(client, job_id, me, server_num, worker_num, ttl, wait_s,
                                 host_source=source, elastic=elastic)


def _elastic_etcd_np(args):
    """(MIN, MAX) of ``--np`` with --elastic_server, or None; checks what goes with it."""
    if args.np is None:
        if args.worker_replacements:
            raise ConfigError(f"--worker_replacements {args.worker_replacements} is for elastic jobs: "
                              "give --np MIN:MAX")
        return None
    low, high = parse_np(args.np)
    if args.collective:
        raise ConfigError(f"--np {args.np} makes a parameter-server job elastic: leave out --collective")
    if args.worker_num is not None:
        raise ConfigError(f"--worker_num {args.worker_num} with --np {args.np} and --elastic_server: the job "
                          f"forms with {low}..{high} workers, as its hosts offer them (--worker_num_per_host); "
                          "leave out --worker_num")
    if args.worker_replacements < 0:
        raise ConfigError(f"--worker_replacements {args.worker_replacements} must be an integer >= 0")
    return low, high


def _elastic_host(args, server):
    """This host's address for the job, and where it came from."""
    if args.host:
        return args.host, "--host"
    if os.environ.get("POD_IP", "").strip():
        return os.environ["POD_IP"].strip(), "POD_IP"
    nic = args.nic or os.environ.get("PADDLE_NIC", "").strip() or None
    if nic:
        addresses = sorted(interface_addresses(nic), key=lambda a: (":" in a, a))
        return addresses[0], f"interface {nic}"
    return rdv_module.address_towards(server), "its route to etcd"


def launch_with_etcd(args: argparse.Namespace) -> int:
    """fleetrun --elastic_server: rendezvous, then run this host's share of the job.

    Blocks until the job is over. Returns launch's exit code.

    Raises:
        ConfigError: bad arguments; RendezvousError: the rendezvous failed.
    """
    rendezvous = rendezvous_from_args(args)
    me = rendezvous.me
    say(f"registering this host, {me.describe()} (address from {rendezvous.host_source}), in "
        f"{rendezvous.where}; waiting for {plural(rendezvous.server_num, 'server')} and "
        + (f"{rendezvous.elastic[0]} to {rendezvous.elastic[1]} workers (--np)" if rendezvous.elastic
           else plural(rendezvous.worker_num, 'worker')))
    try:
        plan = rendezvous.join()
    except KeyboardInterrupt:
        say("interrupted while waiting for the job's hosts; this host's registration is removed")
        return 128 + signal.SIGINT
    say(f"{rendezvous.where} formed in {rendezvous.seconds:.2f} s: "
        + "; ".join(f"{m.addr}: {plan.ranks_of(m.addr)}" for m in plan.members))
    if rendezvous.elastic is not None:
        return _run_elastic_host(args, rendezvous, plan)
    code, down = EXIT_PROCESS_FAILED, None

    def config_for(plan):
        placement = place(plan.servers, plan.workers, host=me.addr,
                          host_source=rendezvous.host_source)
        if placement.whole_job:
            return make_config(args, plan.servers, plan.workers, keys_dir=keys_dir(args, False))
        return make_config(args, plan.servers, plan.workers, local_servers=placement.servers,
                            local_workers=placement.workers, bind_any=placement.bind_any,
                            bind_any_workers=placement.bind_any_workers,
                            host=placement.name, keys_dir=keys_dir(args, True))
    try:
        if args.max_restarts:  # a lost host starts a new round (fleet.launch.etcd_rounds)
            regroup = Regroup(rendezvous, plan, config_for)
            code = launch(regroup.config, monitor=rendezvous.monitor, regroup=regroup)
        else:
            code = launch(config_for(plan), monitor=rendezvous.monitor)
        down = rendezvous.monitor.etcd_down()
    finally:
        rendezvous.leave(code)
    if code != 0 and down is not None:  # the last line: what to fix before a new start
        say(f"exit {code}: the job failed while etcd at {rendezvous.client.endpoint} was "
            f"unreachable (for {down[0]:.1f} s), so the change of membership could not go "
            "through etcd; bring etcd back (or point --elastic_server at a running one) "
            "before starting the job again")
    return code


def _run_elastic_host(args, rendezvous, plan):
    """This host's share of an elastic job formed through etcd (--np with --elastic_server):
    its servers and plan slots, or (a host joining the running job) free slots it takes.
    Returns launch's exit code."""
    me, code, down = rendezvous.me, EXIT_PROCESS_FAILED, None
    registry, round_ = slots_module.SlotRegistry(rendezvous, plan), 0
    try:
        registry.agree_np()
        if rendezvous.late:  # after a round (--max_restarts) the servers may have moved
            round_, plan, assigned = join_newest_round(rendezvous, plan)
            registry = slots_module.SlotRegistry(rendezvous, plan, assigned)
            registry.join_slots = tuple(registry.claim(len(me.workers)))
            if not registry.join_slots:
                raise RendezvousError(f"{rendezvous.where} runs, and this host ({me.describe()}) found no worker "
                                      f"slot to join it in: {registry.why_none}")
            say(f"joining the running {rendezvous.where} in worker slot"
                f"{'s' if len(registry.join_slots) > 1 else ''} {', '.join(map(str, registry.join_slots))}")
            servers, workers, bind_any, bind_any_workers = (), (), (), ()
        else:
            placement = place(plan.servers, plan.workers, host=me.addr, host_source=rendezvous.host_source)
            servers, workers = placement.servers, registry.take_plan_slots()
            bind_any, bind_any_workers = placement.bind_any, placement.bind_any_workers
        registry.start()
        start = 6170 if args.start_port is None else args.start_port
        endpoints = slots_module.slot_endpoints(me, plan, registry.high, start)
        config = make_config(args, plan.servers, endpoints,
                              local_servers=servers, local_workers=workers, bind_any=bind_any,
                              bind_any_workers=bind_any_workers, host=me.addr, keys_dir=keys_dir(args, True),
                              elastic=rendezvous.elastic, worker_replacements=args.worker_replacements)
        if args.max_restarts:
            # A failure that ends the job starts a round: servers moved, slots re-made
            # (fleet.launch.etcd_slot_rounds); this host's worker endpoints stay the same.
            off = bool(bind_any or bind_any_workers)

            def config_for(round_plan, slots, every_slot):
                local = tuple(i for i, e in enumerate(round_plan.servers) if parse_endpoint(e)[0] == me.addr)
                return dataclasses.replace(config, server_endpoints=round_plan.servers, local_servers=local,
                                           local_workers=slots, bind_any=local if off else (),
                                           bind_any_workers=slots if off else (), expected_workers=every_slot)
            registry = SlotRegroup(rendezvous, plan, config_for, registry, len(me.workers), config, round_,
                                   registry.assigned)
            code = launch(registry.config, monitor=registry.monitor, regroup=registry)
        else:
            code = launch(config, monitor=slots_module.ElasticMonitor(rendezvous.monitor, registry))
        down = rendezvous.monitor.etcd_down()
    finally:
        getattr(registry, "registry", registry).stop()
        rendezvous.leave(code)
    if code != 0 and down is not None:
        say(f"exit {code}: the job failed while etcd at {rendezvous.client.endpoint} was unreachable (for "
            f"{down[0]:.1f} s); bring etcd back before starting the job again")
    return code
