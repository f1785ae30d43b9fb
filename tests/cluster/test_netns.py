"""Self-tests of the namespace cluster (tests/cluster/netns.py) the cluster tests run on."""
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

PORT = 7000

# Listens on ADDR:PORT, says "ready", takes one connection and reads it to EOF, then
# prints the bytes received and the seconds from the first byte to EOF ("none" if no
# connection came within ACCEPT_SECONDS, default 20).
SINK = textwrap.dedent("""\
    import socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen(1)
    print("ready", flush=True)
    s.settimeout(float(sys.argv[3]) if len(sys.argv) > 3 else 20)
    try:
        c, _ = s.accept()
    except socket.timeout:
        print("none", flush=True)
        sys.exit(0)
    c.settimeout(20)
    total, first = 0, None
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        if first is None:
            first = time.monotonic()
        total += len(b)
    print(total, time.monotonic() - first if first else 0.0, flush=True)
""")

# Connects to ADDR:PORT within 1 s and sends N bytes; exit 3 if it cannot connect.
SOURCE = textwrap.dedent("""\
    import socket, sys
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
    except OSError as e:
        print("cannot connect:", e)
        sys.exit(3)
    c.settimeout(30)
    c.sendall(b"x" * int(sys.argv[3]))
    c.close()
""")


def start_sink(host, accept_seconds=20):
    proc = host.popen([sys.executable, "-c", SINK, host.addr, PORT, accept_seconds], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line == "ready\n", f"sink on {host.name} did not start: {line!r} {proc.stderr.read()}"
    return proc


def send(host, to, nbytes, timeout=30):
    return host.run([sys.executable, "-c", SOURCE, to.addr, PORT, nbytes], timeout)


def sink_result(proc):
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    nbytes, seconds = out.split()
    return int(nbytes), float(seconds)


def root_links():
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def test_hosts_reach_each_other_over_tcp_across_the_bridge(cluster_factory):
    cluster = cluster_factory(2)
    h1, h2 = cluster.hosts
    assert (h1.name, h2.name) == ("h1", "h2")
    net = cluster.subnet.rsplit(".", 1)[0]
    assert cluster.subnet.endswith(".0/24") and (h1.addr, h2.addr) == (f"{net}.1", f"{net}.2")
    sink = start_sink(h2)
    r = send(h1, h2, 100_000, timeout=10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sink_result(sink)[0] == 100_000
    # loopback is up in every namespace
    lo = h1.run(["ip", "-o", "link", "show", "lo"], 5).stdout
    assert "UP" in lo.split("<")[1].split(">")[0].split(","), lo


def test_the_root_namespace_cannot_reach_the_subnet(cluster_factory):
    cluster = cluster_factory(1)
    h1 = cluster.hosts[0]
    addresses = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                               check=True).stdout
    assert cluster.subnet.rsplit(".", 1)[0] + "." not in addresses
    assert cluster.prefix not in root_links()
    sink = start_sink(h1, accept_seconds=2)
    # The root namespace's default route may lead to a network that answers for any
    # address (a proxy accepts the connection): what matters is that nothing arrives.
    try:
        with socket.create_connection((h1.addr, PORT), timeout=1) as s:
            s.sendall(b"from the root namespace")
    except OSError:
        pass
    out, err = sink.communicate(timeout=10)
    assert out == "none\n", out + err


def test_link_down_cuts_a_host_off_and_link_up_restores_it(cluster_factory):
    cluster = cluster_factory(2)
    h1, h2 = cluster.hosts
    sink = start_sink(h2)
    h2.link_down()
    r = send(h1, h2, 10, timeout=10)
    assert r.returncode == 3, r.stdout + r.stderr
    h2.link_up()
    r = send(h1, h2, 10, timeout=10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sink_result(sink)[0] == 10


def test_ssh_into_a_host_runs_the_command_there(cluster_factory):
    cluster = cluster_factory(2, sshd=True)
    h1, h2 = cluster.hosts
    r = h1.run(["ssh", "-F", cluster.ssh_config, h2.addr, "ip -4 -o addr"], 15)
    assert r.returncode == 0, r.stderr
    assert f"inet {h2.addr}/24" in r.stdout and h1.addr not in r.stdout
    # the per-run known_hosts holds the hosts' keys: StrictHostKeyChecking=yes passes,
    # and an empty known_hosts file makes the same login fail
    empty = f"{cluster.tmpdir}/empty_known_hosts"
    open(empty, "w").close()
    r = h1.run(["ssh", "-F", cluster.ssh_config, "-o", f"UserKnownHostsFile={empty}",
                h2.addr, "true"], 15)
    assert r.returncode == 255 and "Host key verification failed" in r.stderr, r.stderr
    # the sshd daemons are not leftovers; a process started in a host is
    assert cluster.leftovers() == {}
    sleeper = h2.popen(["sleep", "60"])
    left = cluster.leftovers()
    assert list(left) == [h2.ns] and left[h2.ns] == [f"{sleeper.pid} sleep 60"]
    assert sleeper.pid in h2.pids()


def test_teardown_leaves_no_namespace_link_or_process(cluster_factory):
    cluster = cluster_factory(2, sshd=True)
    sleepers = [h.popen(["sleep", "60"]) for h in cluster.hosts]
    names = [h.ns for h in cluster.hosts] + [cluster.bridge_ns]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n in listed for n in names)
    cluster.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cluster.prefix not in listed
    assert cluster.prefix not in root_links()
    for p in sleepers:
        assert p.poll() is not None
    assert all(h.sshd.poll() is not None for h in cluster.hosts)
    import os
    assert not os.path.exists(cluster.tmpdir)


def test_shape_caps_a_tcp_transfer_and_none_removes_it(cluster_factory):
    cluster = cluster_factory(2)
    h1, h2 = cluster.hosts
    cluster.shape("20mbit")
    for ns, dev in ((h1.ns, h1.dev), (cluster.bridge_ns, h1.peer)):
        shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout
        assert "tbf" in shown and "rate 20Mbit" in shown, shown
    sink = start_sink(h2)
    r = send(h1, h2, 4_000_000)
    assert r.returncode == 0, r.stdout + r.stderr
    nbytes, seconds = sink_result(sink)
    # 4 MB at 20 Mbit/s is 1.6 s: the shaper caps the rate (a check of tbf, not of speed)
    assert nbytes == 4_000_000 and seconds > 1.0, seconds
    cluster.shape(None)
    shown = subprocess.run(["tc", "-n", h1.ns, "qdisc", "show", "dev", h1.dev],
                           capture_output=True, text=True).stdout
    assert "tbf" not in shown, shown
    with pytest.raises(ValueError, match="'fast'"):
        cluster.shape("fast")


def test_run_timeout_names_the_host_and_the_command(cluster_factory):
    cluster = cluster_factory(1)
    with pytest.raises(TimeoutError, match=r"host h1 \(10\.[0-9.]+\): sleep 30 did not finish "
                                           r"within 0.5 s"):
        cluster.hosts[0].run(["sleep", "30"], 0.5)
    assert cluster.leftovers() == {}
