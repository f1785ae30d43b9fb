"""Shared memory for the ranks of a worker group on one host: which ranks share a host,
and the memory segment they all map.

Same host: two processes share memory here when they run on the same kernel (the same
``/proc/sys/kernel/random/boot_id``), as the same user, in the same network namespace
and the same PID namespace (``host_identity()``). The network namespace is part of it
on purpose: hosts emulated as network namespaces of one machine (tests/cluster) and
containers with their own network stay "other hosts" and keep the ZeroMQ path, so the
group behaves the same as between real machines; the PID namespace is part of it
because attaching goes through ``/proc/<pid>``.

The segment is an anonymous shared-memory file (``memfd_create``): it has no name, in
``/dev/shm`` or anywhere, so nothing can be left behind whatever happens: the kernel
frees the memory once the last process that maps it has unmapped it or exited (SIGKILL
included). One rank creates it and keeps its descriptor open; the others open it through
``/proc/<creator pid>/fd/<fd>`` (allowed between processes of the same user), map it and
close their descriptor at once. A random number written at the start of the segment
makes sure an attacher opened that segment and not a later file that reused the
descriptor number.
"""
import mmap
import os
import secrets
import struct

import numpy as np

from fleet.errors import ConfigError, TransportError

GROUP_SHM_ENV = "FLEET_GROUP_SHM"
HEADER_BYTES = 4096  # the segment's key, then page-aligned areas
ALIGN = 4096
_KEY = struct.Struct("<Q")


def shm_enabled(environ=None):
    """Returns whether FLEET_GROUP_SHM allows shared memory (unset or "1": yes; "0": no).

    Raises:
        ConfigError: another value (names it and the two allowed ones).
    """
    text = (os.environ if environ is None else environ).get(GROUP_SHM_ENV, "").strip()
    if text in ("", "1"):
        return True
    if text == "0":
        return False
    raise ConfigError(f"{GROUP_SHM_ENV}={text!r} is neither 0 nor 1; set it to 0 to make the worker group's ranks "
                      f"on one host all-reduce over ZeroMQ instead of shared memory, or 1 (the default)")


def host_identity():
    """Returns a string equal in two processes exactly when they can share a segment
    (see the module docstring), or None when this system offers no way to (not Linux,
    or no ``memfd_create``)."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        net = os.stat("/proc/self/ns/net").st_ino
        pid = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}/uid={os.getuid()}/net={net}/pid={pid}"


def aligned(nbytes):
    """``nbytes`` rounded up to a whole page (at least one page)."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class SharedSegment:
    """A memory segment mapped by every rank of a group on one host.

    ``key`` ([pid, fd, random]) is what the creator sends the others so they can attach.
    Not thread-safe (the group's lock serializes its use).
    """

    def __init__(self, mm, nbytes, key, fd=None):
        self._mm = mm
        self.nbytes = nbytes
        self.key = key
        self._fd = fd  # the creator keeps the file open so the others can open it

    @classmethod
    def create(cls, nbytes, name="fleet-group"):
        """Creates a segment of ``nbytes`` (rounded up to pages) in this process;
        ``name`` shows in /proc/<pid>/maps (as ``memfd:<name>``).

        Raises:
            TransportError: the system refused the memory (names the size and the fix).
        """
        nbytes = aligned(nbytes) + HEADER_BYTES
        fd = None
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            raise TransportError(f"the worker group cannot create {nbytes} bytes of shared memory ({e}); free "
                                 f"memory, or set {GROUP_SHM_ENV}=0 to all-reduce over ZeroMQ") from e
        key = [os.getpid(), fd, secrets.randbits(63)]
        mm[:_KEY.size] = _KEY.pack(key[2])
        return cls(mm, nbytes, key, fd)

    @classmethod
    def attach(cls, key, nbytes):
        """Maps the segment another rank created and described as ``key`` and ``nbytes``.

        Raises:
            TransportError: the segment cannot be opened or is not the one described
                (its creator replaced it or died meanwhile; or the system forbids it).
        """
        pid, fd_number, number = key
        path = f"/proc/{pid}/fd/{fd_number}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise TransportError(f"cannot open the worker group's shared memory at {path} ({e.strerror}): its "
                                 f"creator (pid {pid}) exited or replaced it, or this system forbids opening "
                                 f"another process's files; set {GROUP_SHM_ENV}=0 on every worker to all-reduce "
                                 f"over ZeroMQ") from e
        try:
            if os.fstat(fd).st_size != nbytes:
                raise TransportError(f"{path} is not the worker group's shared memory of {nbytes} bytes (its "
                                     f"creator replaced it)")
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        if _KEY.unpack(mm[:_KEY.size])[0] != number:
            mm.close()
            raise TransportError(f"{path} is not the worker group's shared memory (its creator replaced it)")
        return cls(mm, nbytes, list(key))

    def view(self, dtype, count, offset):
        """A numpy array of ``count`` ``dtype`` items at ``offset`` bytes after the header."""
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=HEADER_BYTES + offset)

    def close(self):
        """Unmaps the segment (once no array views it) and closes the creator's file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            self._mm.close()
        except BufferError:
            pass  # an array still views it: the mapping goes when that array does
