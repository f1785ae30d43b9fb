"""Reading one input (a file, or a file through a pipe command) as chunks of whole lines."""
import os
import select
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


class InputStream:
    """One input of a pass: a file read directly or through ``sh -c pipe_command``
    (in :func:`pipe_environment`).

    Args:
        path: the file.
        pipe_command: None to read the file itself, else a shell command that gets the
            file on stdin and writes the text to parse on stdout.
        on_spawn: callable(Popen) called right after the command starts (so the owner can
            kill it on close), or None.

    Not thread-safe: owned by one producer thread.
    """

    def __init__(self, path, pipe_command=None, on_spawn=None):
        self.path = path
        self.pipe_command = pipe_command
        self._proc = None
        self._stderr = None
        self._stdin = None
        if pipe_command is None:
            self._stream = open(path, "rb", buffering=0)
            return
        self._stdin = open(path, "rb")
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                ["sh", "-c", pipe_command], stdin=self._stdin, stdout=subprocess.PIPE,
                stderr=self._stderr, bufsize=0, start_new_session=True, env=pipe_environment())
        except OSError as e:
            self._stdin.close()
            self._stderr.close()
            raise DataError(f"pipe command {pipe_command!r} could not start for file "
                            f"{path!r}: {e}") from e
        self._stream = self._proc.stdout
        if on_spawn is not None:
            on_spawn(self._proc)

    @property
    def proc(self):
        """The pipe command's Popen, or None when the file is read directly."""
        return self._proc

    def where(self, line):
        """Names line ``line`` (1-based) of this input for messages."""
        if self.pipe_command is None:
            return f"file {self.path!r}, line {line}"
        return (f"file {self.path!r} through pipe command {self.pipe_command!r}, "
                f"output line {line}")

    def chunks(self, chunk_bytes=CHUNK_BYTES):
        """A LineChunks reader of this input."""
        return LineChunks(self._stream, chunk_bytes, is_pipe=self._proc is not None)

    def finish(self, timeout=30.0):
        """Waits for the pipe command after its output ended and checks its exit code.

        Raises:
            DataError: the command exited non-zero (the message has its exit code and the
                end of its stderr), or it still ran ``timeout`` seconds after closing its
                output (it is killed).
        """
        if self._proc is None:
            return
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process_group(self._proc)
            code = self._proc.wait()
            raise DataError(
                f"pipe command {self.pipe_command!r} on file {self.path!r} closed its output "
                f"but did not exit within {timeout:g}s; it was killed") from None
        if code != 0:
            raise DataError(
                f"pipe command {self.pipe_command!r} failed on file {self.path!r} with exit "
                f"code {code}; end of its stderr: {self._stderr_tail()!r}")

    def _stderr_tail(self):
        self._stderr.flush()
        size = self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        return self._stderr.read().decode("utf-8", "replace").strip()

    def close(self):
        """Closes the input; kills the pipe command if it still runs. Never blocks long."""
        if self._proc is not None and self._proc.poll() is None:
            kill_process_group(self._proc)
        self._stream.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass
        for f in (self._stdin, self._stderr):
            if f is not None:
                f.close()


def kill_process_group(proc):
    """Kills ``proc`` and everything it started (it runs in its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
