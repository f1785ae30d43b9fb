"""The etcd rendezvous of fleetrun --elastic_server on three hosts (network namespaces on a
bridge, tests/cluster/netns.py), etcd (Debian's etcd-server) in h1: how long the hosts take
to form a job, to notice a lost host, and to notice etcd gone.

    python benchmarks/bench_etcd_rendezvous.py [--rounds 5] [--ttl 10]

Each host runs the rendezvous of fleetrun (``Rendezvous.join``, the same code, no training)
for a job of 2 servers and 3 workers (h1 and h2: 1 server and 1 worker, h3: 1 worker):

- ``join_s``: per round, the longest ``join()`` of the three hosts (its first call to etcd
  to the plan in hand), the three started together (one ``ip netns exec`` each, in turn);
- ``lost_host_s``: h3's rendezvous process is SIGKILLed once the job formed; seconds until
  h1's membership monitor reports the change (lease TTL ``--ttl``, etcd's expiry check);
- ``etcd_down_noticed_s``: etcd SIGKILLed; seconds until h1's keepalive says it is gone
  (every TTL/3).

Times are on this machine's clock (the namespaces share it). Needs root, iproute2 and
/usr/bin/etcd; prints one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tests import etcd_server  # noqa: E402
from tests.cluster.netns import Cluster, missing_requirements  # noqa: E402

HOST = """
import sys, time
sys.path.insert(0, {root!r})
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_rendezvous import HostRecord, Rendezvous, host_endpoints
etcd, job, addr, servers, ttl, watch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
me = HostRecord(addr, *host_endpoints(addr, servers, 1, 6170), addr)
rdv = Rendezvous(EtcdClient(etcd, 2.0), job, me, 2, 3, ttl, 60)
rdv.join()
print("formed", rdv.seconds, time.time(), flush=True)
while watch == "watch":
    if rdv.monitor.poll():
        print("change", time.time(), flush=True)
        break
    if rdv.monitor.etcd_down():
        print("etcd_down", time.time(), flush=True)
        break
    time.sleep(0.02)
sys.stdin.read() if watch == "wait" else None
rdv.leave(0)
"""


def _start(host, etcd, job, ttl, watch):
    servers = 0 if host.name == "h3" else 1
    return host.popen([sys.executable, "-c", HOST.format(root=ROOT), etcd.endpoint, job,
                       host.addr, servers, ttl, watch], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _line(proc, word, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(word):
            return line.split()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"a rendezvous process exited {proc.returncode} before '{word}'")
    raise RuntimeError(f"no '{word}' within {timeout} s")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ttl", type=int, default=10)
    args = p.parse_args()
    problems = missing_requirements(sshd=False) + [m for m in [etcd_server.missing()] if m]
    if problems:
        sys.exit("bench_etcd_rendezvous: " + "; ".join(problems))
    with Cluster(3) as cluster, tempfile.TemporaryDirectory() as tmp:
        h1, h2, h3 = cluster.hosts

        def probe(endpoint):
            return h1.run([sys.executable, "-c", "import json,sys,urllib.request as u; u.urlopen(u.Request("
                           "f'http://{sys.argv[1]}/v3/kv/range', data=b'{\"key\": \"AA==\"}'), timeout=1)",
                           endpoint], 5).returncode
        etcd = etcd_server.EtcdServer(h1.addr, 2379, 2380, os.path.join(tmp, "etcd"),
                                      popen=h1.popen, probe=probe).start()
        joins = []
        for r in range(args.rounds):
            procs = [_start(h, etcd, f"bench-{r}", args.ttl, "none") for h in cluster.hosts]
            joins.append(max(float(_line(proc, "formed")[1]) for proc in procs))
            for proc in procs:
                proc.communicate(timeout=30)
        watcher = _start(h1, etcd, "bench-lost", args.ttl, "watch")
        others = [_start(h, etcd, "bench-lost", args.ttl, "wait") for h in (h2, h3)]
        _line(watcher, "formed")
        killed = time.time()
        os.killpg(others[1].pid, 9)
        lost_s = float(_line(watcher, "change")[1]) - killed
        watcher.communicate(timeout=30)
        others[0].communicate("", timeout=30)
        watcher = _start(h1, etcd, "bench-down", args.ttl, "watch")
        others = [_start(h, etcd, "bench-down", args.ttl, "wait") for h in (h2, h3)]
        _line(watcher, "formed")
        killed = time.time()
        etcd.kill()
        down_s = float(_line(watcher, "etcd_down")[1]) - killed
        for proc in [watcher, *others]:
            proc.kill()
            proc.wait(10)
    print(json.dumps({"bench": "etcd_rendezvous", "hosts": 3, "ttl_s": args.ttl,
                      "join_s_median": round(statistics.median(joins), 3),
                      "join_s_max": round(max(joins), 3), "join_s": [round(j, 3) for j in joins],
                      "lost_host_s": round(lost_s, 2), "etcd_down_noticed_s": round(down_s, 2),
                      "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))


if __name__ == "__main__":
    main()
