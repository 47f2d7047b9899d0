"""Doorbells: SQLite's cross-process wake-up, a file touched after a commit and watched with inotify.

PostgreSQL wakes a waiting worker with NOTIFY; SQLite has nothing like it, so its waiters poll
`PRAGMA data_version` with a growing interval (2 → 25 ms for jobs), and a job submitted to idle workers waited
for the next poll. A doorbell is a file next to the database, `<db>-tenure-<name>`. After committing a change
that a waiter in another process acts on (a job became claimable; a command was sent), the store writes one
byte at offset 0 of the bell's file; every store that waits on that bell watches the file with inotify and is
woken at once.

It rings after the commit returned, so whoever wakes sees the change. Watching the `-wal` file instead would
wake on every write of every transaction, before its commit is visible (the fsync comes after the last write).

It is only an accelerator: the poll stays, so a lost ring, a bell file deleted under a running store, or a
platform without inotify (anything but Linux) costs latency, never a job. Ownership: each store opens the bell
files it rings (created if missing, never deleted: they are shared by every process on the database, like the
`-tenure-lock` file) and owns the inotify descriptor it watches with; `close` releases both.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger("tenure.store.sqlite")

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000


def _load_inotify() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_inotify()


BELLS = ("jobs", "control")
"""The doorbells of a database. jobs: a job became claimable; control: a command or cancel was sent."""


def bell_path(db_path: str, name: str) -> str:
    """The file of doorbell `name` of the database at `db_path`."""
    return f"{db_path}-tenure-{name}"


class Bell:
    """The ringing side of one doorbell: an open descriptor of its file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def ring(self) -> None:
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, b"\0", 0)
        except OSError as exc:  # a full disk, say: the waiters' polls still find the change
            log.debug("could not ring %s: %s", self.path, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Watch:
    """The waiting side: one inotify descriptor on this event loop, each watched bell setting its own event."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self._events: dict[int, asyncio.Event] = {}
        loop.add_reader(fd, self._readable)

    @classmethod
    def open(cls) -> Watch | None:
        """A watch on the running loop, or None where inotify is missing or out of instances (then: poll)."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.debug("inotify_init1 failed (%s): polling only", os.strerror(ctypes.get_errno()))
            return None
        return cls(fd, asyncio.get_running_loop())

    def add(self, path: str, event: asyncio.Event) -> None:
        """Set `event` whenever `path` is written (where it cannot be watched, the poll alone wakes)."""
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(path), _IN_MODIFY) if _LIBC is not None else -1
        if wd < 0:
            log.debug("cannot watch %s (%s): polling only", path, os.strerror(ctypes.get_errno()))
            return
        self._events[wd] = event

    def _readable(self) -> None:
        # Each record is struct inotify_event {int wd; uint32 mask, cookie, len; char name[len]}; watches on
        # files carry no name. An overflow (wd -1) means rings were dropped: wake everyone.
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("inotify read failed, falling back to polling: %s", exc)
            self.close()
            return
        pos = 0
        while pos + 16 <= len(data):
            wd = int.from_bytes(data[pos : pos + 4], sys.byteorder, signed=True)
            length = int.from_bytes(data[pos + 12 : pos + 16], sys.byteorder)
            pos += 16 + length
            if wd == -1:
                for event in self._events.values():
                    event.set()
            elif (rung := self._events.get(wd)) is not None:
                rung.set()

    def close(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(Exception):  # the loop may already be closed
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        self._events.clear()
