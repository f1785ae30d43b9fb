"""One host of a running fleetrun --hosts job: the ssh session running its fleetrun.

The dispatcher runs on every host, over one ssh each, the per-host form of fleetrun
(``python -m fleet.launch --servers ALL --workers ALL --host ADDR ... --stop_on_stdin_eof
--result_json ...``; ``--collective --workers ALL ...`` for a collective job), whose stdin
is a pipe it keeps open: when the dispatcher or its ssh dies, the remote fleetrun sees EOF
and stops its processes. Worker 0's host streams its output here; every host's stderr is
copied prefixed ``[host] ``, both kept in LOG_DIR/<host>/fleetrun.log.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from fleet.launch.local import die_with_parent
from fleet.launch.report import write_stdout

RESULT_NAME = "fleetrun-result.json"


class Remote:
    """The ssh session running one host's fleetrun, and what came back from it."""

    def __init__(self, host, index, info, endpoint_host, log_dir):
        self.host = host
        self.index = index
        self.info = info
        self.endpoint_host = endpoint_host
        self.log_dir = log_dir                   # local LOG_DIR/<host>
        self.proc = None
        self.exit_time = None                    # time.time() when ssh exited
        self.stopped = False                     # the dispatcher stopped it
        self.stop_reason = None
        self.last_stderr = ""
        self.result = None                       # the parsed result JSON, once fetched
        self.unreachable = None                  # (code, stderr) of a sweep ssh that found no way to it
        self.threads = []

    @property
    def name(self):
        """The host's name (as written), which names its log directory."""
        return self.host.name

    @property
    def label(self):
        """The host in messages: "host NAME", with its endpoint address when that differs."""
        if self.endpoint_host and self.endpoint_host != self.host.name:
            return f"host {self.name} ({self.endpoint_host})"
        return f"host {self.name}"

    @property
    def returncode(self):
        """The ssh's exit code, or None while it runs or before it started."""
        return self.proc.returncode if self.proc is not None else None

    def start(self, argv, streams_stdout, exited):
        """Start the ssh ``argv`` and the threads that copy its output.

        Args:
            argv: the ssh command running this host's fleetrun.
            streams_stdout: True on worker 0's host: its stdout goes to this stdout, else
                into LOG_DIR/<host>/fleetrun.log with its stderr.
            exited: an Event set when the ssh has exited and its output is copied.

        Does not block; the threads are ``threads`` (the last one waits for the ssh).
        Not thread-safe: called once, by the dispatcher's thread.
        """
        log = open(os.path.join(self.log_dir, "fleetrun.log"), "a", encoding="utf-8")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=die_with_parent(os.getpid()))
        lock = threading.Lock()

        def copy_stdout():
            with self.proc.stdout:
                for chunk in iter(lambda: self.proc.stdout.read1(1 << 16), b""):
                    if streams_stdout:
                        write_stdout(chunk)
                    else:
                        with lock:
                            log.write(chunk.decode("utf-8", "replace"))
                            log.flush()

        def copy_stderr():
            with self.proc.stderr:
                for raw in iter(self.proc.stderr.readline, b""):
                    line = raw.decode("utf-8", "replace").rstrip("\n")
                    if line.strip():
                        self.last_stderr = line
                    print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
                    with lock:
                        log.write(line + "\n")
                        log.flush()

        def wait():
            for t in self.threads[:2]:
                t.join()
            self.proc.wait()
            self.exit_time = time.time()
            log.close()
            exited.set()

        self.threads = [threading.Thread(target=f, daemon=True, name=f"fleetrun-{f.__name__} {self.name}")
                        for f in (copy_stdout, copy_stderr)]
        for t in self.threads:
            t.start()
        waiter = threading.Thread(target=wait, daemon=True, name=f"fleetrun-wait {self.name}")
        waiter.start()
        self.threads.append(waiter)
