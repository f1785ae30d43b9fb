"""fleetrun's own messages and how a process's end is told: stderr lines, log tails, the
error a log ends with."""
import os
import re
import signal
import sys

TAIL_LINES = 20


def say(message):
    """Print one of fleetrun's own messages ("fleetrun: ...") on stderr."""
    print(f"fleetrun: {message}", file=sys.stderr, flush=True)


class _SayLogger:
    """A logger-like sink for WaitLog: fleetrun's own messages go to stderr via say."""

    @staticmethod
    def info(fmt, *args):
        say(fmt % args)


SAY_LOGGER = _SayLogger()


def write_stdout(chunk):
    """Copy bytes to fleetrun's stdout and flush.

    Returns:
        None, or the OSError / ValueError that stopped the write (stdout closed, e.g.
        piped into ``head``): the caller decides whether to say so.
    """
    try:
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(chunk.decode("utf-8", "replace"))
        else:
            out.write(chunk)
        sys.stdout.flush()
    except (OSError, ValueError) as e:
        return e
    return None


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def plural(count, noun):
    return f"{count} {noun}{'' if count == 1 else 's'}"


def tail(path, count):
    """The last count lines of a text file (undecodable bytes replaced)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except OSError as e:
        return [f"(could not read {path}: {e.strerror})"]
    return data.decode("utf-8", "replace").splitlines()[-count:]


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Timeout)\b(:.*)?$")


def last_error(lines):
    """The last line that looks like the end of a Python traceback ("pkg.SomeError: text")."""
    for line in reversed(lines):
        if _ERROR_LINE.match(line.strip()):
            text = line.strip()
            return text if len(text) <= 400 else text[:397] + "..."
    return ""
