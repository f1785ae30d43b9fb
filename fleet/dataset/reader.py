"""Reading one input (a file, or a file through a pipe command) as chunks of whole lines."""
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile

import numpy as np

from fleet.errors import DataError

CHUNK_BYTES = 4 << 20
_STDERR_TAIL = 2000


class LineChunks:
    """Reads a raw binary stream into a reusable buffer, a chunk of whole lines at a time.

    Not thread-safe: one reader per producer thread.
    """

    def __init__(self, stream, chunk_bytes=CHUNK_BYTES, is_pipe=False):
        self._stream = stream
        self._is_pipe = is_pipe
        self._alloc(chunk_bytes)
        self._have = 0  # bytes in the buffer
        self._used = 0  # bytes handed out by the last call
        self._eof = False

    def _alloc(self, size):
        self._bytes = bytearray(size + 1)  # + 1 for the kernels' end sentinel
        self._array = np.frombuffer(self._bytes, dtype=np.uint8)
        self._capacity = size

    def next_chunk(self):
        """Returns ``(buf, end)`` with whole lines in ``buf[:end]``, or None at the end.

        The buffer is reused: parse it before calling again. Blocks while the stream
        has no data (a pipe). A last line without a newline is returned with
        ``buf[end] == 0``.
        """
        if self._used:
            rest = self._have - self._used
            self._bytes[:rest] = self._bytes[self._used:self._have]
            self._have = rest
            self._used = 0
        searched = 0
        while True:
            self._fill()
            if self._have == 0:
                return None
            cut = self._bytes.rfind(b"\n", searched, self._have)
            if cut >= 0:
                self._used = cut + 1
                return self._array, self._used
            if self._eof:
                self._bytes[self._have] = 0
                self._used = self._have
                return self._array, self._used
            # one line longer than the buffer: grow it and read on
            searched = self._have
            old = self._bytes
            self._alloc(2 * self._capacity)
            self._bytes[:self._have] = old[:self._have]

    def _fill(self):
        view = memoryview(self._bytes)
        try:
            while self._have < self._capacity and not self._eof:
                n = self._stream.readinto(view[self._have:self._capacity])
                if not n:
                    self._eof = True
                    break
                self._have += n
                # A pipe gives what its writer has produced so far: hand on the lines we
                # have rather than wait for a full chunk when more would block.
                if (self._is_pipe and self._bytes.find(b"\n", self._have - n, self._have) >= 0
                        and not select.select([self._stream], [], [], 0)[0]):
                    break
        finally:
            view.release()


def pipe_environment(environ=None):
    """The environment of a pipe command: this process's, with the directory of the
    running Python first on PATH. A pipe command's ``python`` (``python3``) is then the
    Python that runs the job, with its packages (``fleet.data_generator`` among them), also
    when the job's environment was not activated (``venv/bin/fleetrun ...``), as Paddle's
    pipe commands get the Python of the installation that runs them."""
    env = dict(os.environ if environ is None else environ)
    bindir = os.path.dirname(sys.executable)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if bindir and parts[:1] != [bindir]:
        env["PATH"] = os.pathsep.join([bindir] + [p for p in parts if p != bindir])
    return env


REMOTE_PREFIXES = ("hdfs:", "afs:")
DEFAULT_FS_COMMAND = "hadoop fs"


def is_remote(path):
    """True for a file on HDFS or AFS (``hdfs:...``, ``afs:...``), read through a command."""
    return path.startswith(REMOTE_PREFIXES)


def source_command(path, fs_command=DEFAULT_FS_COMMAND, download_cmd=None):
    """The shell command that writes the text of ``path`` on its stdout, or None for a
    local file read as it is. As Paddle's readers: a remote file through
    ``download_cmd "path"`` (``set_download_cmd``) or else ``<fs_command> -text "path"``
    (``hadoop fs``, with ``set_hdfs_config``'s ``-D fs.default.name=... -D
    hadoop.job.ugi=...``); a local ``.gz`` file through ``gzip -dc``."""
    quoted = shlex.quote(path)
    if is_remote(path):
        return f"{download_cmd} {quoted}" if download_cmd else f"{fs_command or DEFAULT_FS_COMMAND} -text {quoted}"
    if path.endswith(".gz"):
        return f"gzip -dc {quoted}"
    return None


class InputStream:
    """One input of a pass: a file read directly or through ``sh -c pipe_command``
    (in :func:`pipe_environment`), its text coming from the file itself or from its
    source command (:func:`source_command`; a separate process, so its failure is
    reported even when the pipe command succeeds).

    Args:
        path: the file.
        pipe_command: None to read the file itself, else a shell command that gets the
            file on stdin and writes the text to parse on stdout.
        on_spawn: callable(Popen) called right after each command starts (so the owner
            can kill it on close), or None.
        source: the source command, or None to open ``path``.

    Not thread-safe: owned by one producer thread.
    """

    def __init__(self, path, pipe_command=None, on_spawn=None, source=None):
        self.path = path
        self.pipe_command = pipe_command
        self.source = source
        self._proc = None
        self._source_proc = None
        self._stderr = None
        self._source_stderr = None
        self._stdin = None
        try:
            if source is not None:
                self._source_stderr = tempfile.TemporaryFile()
                self._source_proc = self._start(source, subprocess.DEVNULL, self._source_stderr, "source command",
                                                on_spawn)
                self._stdin = self._source_proc.stdout
            if pipe_command is None:
                self._stream = self._stdin if self._stdin is not None else open(path, "rb", buffering=0)
                return
            if self._stdin is None:
                self._stdin = open(path, "rb")
            self._stderr = tempfile.TemporaryFile()
            self._proc = self._start(pipe_command, self._stdin, self._stderr, "pipe command", on_spawn)
        except BaseException:
            self.close()
            raise
        self._stream = self._proc.stdout

    def _start(self, command, stdin, stderr, what, on_spawn):
        try:
            proc = subprocess.Popen(["sh", "-c", command], stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                                    bufsize=0, start_new_session=True, env=pipe_environment())
        except OSError as e:
            raise DataError(f"{what} {command!r} could not start for file {self.path!r}: {e}") from e
        if on_spawn is not None:
            on_spawn(proc)
        return proc

    @property
    def procs(self):
        """The Popens of its commands (none when the file is read directly)."""
        return [p for p in (self._source_proc, self._proc) if p is not None]

    def where(self, line):
        """Names line ``line`` (1-based) of this input for messages."""
        if self.pipe_command is None and self.source is None:
            return f"file {self.path!r}, line {line}"
        through = " and ".join(f"{what} {command!r}" for what, command in
                               (("source command", self.source), ("pipe command", self.pipe_command)) if command)
        return f"file {self.path!r} through {through}, output line {line}"

    def chunks(self, chunk_bytes=CHUNK_BYTES):
        """A LineChunks reader of this input."""
        return LineChunks(self._stream, chunk_bytes, is_pipe=self._proc is not None or self._source_proc is not None)

    def finish(self, timeout=30.0):
        """Waits for the pipe command after its output ended and checks its exit code.

        Raises:
            DataError: the command exited non-zero (the message has its exit code and the
                end of its stderr), or it still ran ``timeout`` seconds after closing its
                output (it is killed).
        """
        # The source first: a pipe command that failed because its input was cut short
        # says less than the source command's own failure.
        for proc, command, what, stderr in ((self._source_proc, self.source, "source command", self._source_stderr),
                                            (self._proc, self.pipe_command, "pipe command", self._stderr)):
            if proc is None:
                continue
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_process_group(proc)
                code = proc.wait()
                raise DataError(
                    f"{what} {command!r} on file {self.path!r} closed its output "
                    f"but did not exit within {timeout:g}s; it was killed") from None
            if code != 0:
                raise DataError(
                    f"{what} {command!r} failed on file {self.path!r} with exit "
                    f"code {code}; end of its stderr: {_tail(stderr)!r}")

    def close(self):
        """Closes the input; kills its commands if they still run. Never blocks long."""
        procs = self.procs
        for proc in procs:
            if proc.poll() is None:
                kill_process_group(proc)
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.close()
        for proc in procs:
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        for f in (self._stdin, self._stderr, self._source_stderr):
            if f is not None:
                f.close()


def _tail(stderr):
    stderr.flush()
    size = stderr.seek(0, os.SEEK_END)
    stderr.seek(max(0, size - _STDERR_TAIL))
    return stderr.read().decode("utf-8", "replace").strip()


def kill_process_group(proc):
    """Kills ``proc`` and everything it started (it runs in its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
