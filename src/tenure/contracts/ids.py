"""Ids and fencing tokens: time-ordered UUIDs (jobs, executions, workers) and the random token of a claim."""

from __future__ import annotations

import os
import threading
import time
import uuid

_id_lock = threading.Lock()
_id_last = [0, 0]  # last millisecond, last 12-bit counter


def new_id() -> str:
    """A time-ordered UUID (version 7, RFC 9562 with a 12-bit counter): ids made by one process are strictly
    increasing, and ids sort by creation, so B-tree inserts stay append-only and pages are stable."""
    return new_ids(1)[0]


def new_ids(n: int) -> list[str]:
    """`n` of `new_id`'s UUIDs, in increasing order, for one clock read, one lock and one read of the OS's
    randomness (a claim of up to `n` jobs makes its execution ids before it knows how many it will get: ten
    `new_id()` calls cost five times as much)."""
    if n <= 0:
        return []
    rand = os.urandom(8 * n + 2)
    out = []
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, counter = _id_last
        if ms <= last_ms:
            ms, counter = last_ms, counter + 1
        else:
            counter = int.from_bytes(rand[:2], "big") & 0x3FF  # leave room to count up
        for i in range(2, 8 * n + 2, 8):
            if counter > 0xFFF:  # more than 4,096 ids in one millisecond: borrow the next one
                ms, counter = ms + 1, 0
            r = int.from_bytes(rand[i : i + 8], "big") & ((1 << 62) - 1)
            h = f"{(ms & ((1 << 48) - 1)) << 80 | (0x7 << 76) | counter << 64 | (0b10 << 62) | r:032x}"
            out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
            counter += 1
        _id_last[0], _id_last[1] = ms, counter - 1
    return out


def is_uuid(text: str) -> bool:
    """Whether `text` is a UUID in any of its usual spellings (job and execution ids are)."""
    try:
        uuid.UUID(text)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


def new_token() -> int:
    """A fencing token: 63 random bits, bound to one claim."""
    return int.from_bytes(os.urandom(8), "big") >> 1
