"""The supervisor of `tenure up` on real child processes (small Python scripts instead of the gateway and
workers): a dead child comes back after its own backoff, independently of the others, and a stop ends all."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from tenure.supervise import Backoff, Child, run_children

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


async def wait_for_new_pid(child: Child, old: int, within_s: float) -> float:
    """Seconds until `child` runs a process other than `old`."""
    t0 = time.monotonic()
    async with asyncio.timeout(within_s):
        while child.proc is None or child.proc.pid == old or child.proc.returncode is not None:
            await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_a_child_in_a_long_backoff_does_not_delay_the_restart_of_another() -> None:
    looping = Child("worker-1", SLEEPER, backoff=Backoff(first_s=30.0))
    steady = Child("worker-2", SLEEPER, backoff=Backoff(first_s=0.2))
    gateway = Child("gateway", SLEEPER)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(run_children([looping, steady, gateway], dict(os.environ), stop, kill_after_s=5))
        async with asyncio.timeout(10):
            while steady.proc is None or looping.proc is None or gateway.proc is None:
                await asyncio.sleep(0.02)
        first = looping.proc.pid
        os.kill(first, signal.SIGKILL)  # worker-1 now waits 30 s before it runs again
        await asyncio.sleep(0.2)
        old = steady.proc.pid
        os.kill(old, signal.SIGKILL)
        took = await wait_for_new_pid(steady, old, within_s=10)
        assert took < 3, f"worker-2 came back after {took:.1f}s"
        assert steady.restarts == 1 and looping.restarts == 0
        assert looping.proc.pid == first and looping.proc.returncode is not None  # still backing off
        procs = [c.proc for c in (steady, gateway)]
        stop.set()  # ends the backoff of worker-1 too: nothing is started after a stop
        async with asyncio.timeout(10):
            await run
    assert all(p is not None and p.returncode == -signal.SIGTERM for p in procs)
    assert looping.proc.pid == first


async def test_a_child_that_ignores_sigterm_is_killed_after_the_drain_timeout() -> None:
    stubborn = Child(
        "worker-1",
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(run_children([stubborn], dict(os.environ), stop, kill_after_s=0.5))
        async with asyncio.timeout(10):
            while stubborn.proc is None:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # let the child install its handler
        stop.set()
        async with asyncio.timeout(10):
            await run
    assert stubborn.proc is not None and stubborn.proc.returncode == -signal.SIGKILL


async def test_a_worker_that_exits_0_after_a_drain_is_not_restarted_one_that_crashes_is() -> None:
    # Each child exits at once the first time (drained: 0, crashed: 1), then sleeps when started again.
    marker = f"/tmp/tenure-supervise-{os.getpid()}-{time.monotonic_ns()}"
    script = "import os, sys, time\np = sys.argv[1]\nif not os.path.exists(p):\n    open(p, 'w').close()\n" \
             "    sys.exit(int(sys.argv[2]))\ntime.sleep(600)\n"  # fmt: skip
    drained = Child(
        "worker-1", [sys.executable, "-c", script, marker + "-a", "0"], backoff=Backoff(first_s=0.1), drains=True
    )
    crashed = Child(
        "worker-2", [sys.executable, "-c", script, marker + "-b", "1"], backoff=Backoff(first_s=0.1), drains=True
    )
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            run = tg.create_task(run_children([drained, crashed], dict(os.environ), stop, kill_after_s=5))
            async with asyncio.timeout(15):
                while crashed.restarts < 1 or crashed.proc is None or crashed.proc.returncode is not None:
                    await asyncio.sleep(0.02)
            await asyncio.sleep(1.0)  # many backoffs of 0.1 s: a restart of worker-1 would have happened by now
            assert drained.restarts == 0 and drained.proc is not None and drained.proc.returncode == 0
            stop.set()
            async with asyncio.timeout(10):
                await run
    finally:
        for suffix in ("-a", "-b"):
            if os.path.exists(marker + suffix):
                os.unlink(marker + suffix)
