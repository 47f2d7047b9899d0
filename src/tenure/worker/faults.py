"""Fault injection points for crash and fencing tests (and the demo), set with `TENURE_FAULTS`.

    TENURE_FAULTS="after_claim=stop"            SIGSTOP this worker right after its first claim
    TENURE_FAULTS="after_start=kill"            SIGKILL itself right after its first start CAS
    TENURE_FAULTS="after_claim=sleep:30"        park 30 s between claim and start (once)
    TENURE_FAULTS="after_claim@slow=sleep:30"   only for jobs of agent `slow`

Each rule fires once per process. Points: after_claim, after_start, before_finish. Never set in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tenure.contracts.errors import ConfigError

log = logging.getLogger("tenure.faults")
POINTS = ("after_claim", "after_start", "before_finish")


@dataclass(slots=True)
class _Rule:
    point: str
    agent: str | None
    action: str
    seconds: float = 0.0
    fired: bool = False


@dataclass(slots=True)
class Faults:
    """Parsed fault rules; `await faults.hit(point, agents)` runs a matching rule once.

    `freeze` performs the `stop` action; the composition root may route it through the store so that the
    process never freezes holding a database lock (see JobStore.run_between_transactions).
    """

    rules: list[_Rule] = field(default_factory=list)
    freeze: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        rules = []
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            where, sep, action = item.partition("=")
            point, _, agent = where.partition("@")
            if not sep or point not in POINTS:
                raise ConfigError(f"TENURE_FAULTS: bad rule {item!r} (points: {', '.join(POINTS)})")
            seconds = 0.0
            if action.startswith("sleep:"):
                try:
                    seconds = float(action[6:])
                except ValueError:
                    raise ConfigError(f"TENURE_FAULTS: bad sleep in {item!r}") from None
                action = "sleep"
            if action not in ("stop", "kill", "sleep"):
                raise ConfigError(f"TENURE_FAULTS: unknown action in {item!r} (stop, kill, sleep:N)")
            rules.append(_Rule(point, agent or None, action, seconds))
        return cls(rules)

    def armed(self, point: str) -> bool:
        """Whether a rule for `point` has yet to fire (the worker then keeps that point reachable)."""
        return any(not rule.fired and rule.point == point for rule in self.rules)

    async def hit(self, point: str, agents: set[str], interrupt: asyncio.Event | None = None) -> None:
        """Run the first unfired rule for `point` (and one of `agents`). A sleep ends early on `interrupt`."""
        for rule in self.rules:
            if rule.fired or rule.point != point or (rule.agent is not None and rule.agent not in agents):
                continue
            rule.fired = True
            log.warning("fault injected at %s: %s", point, rule.action)
            if rule.action == "stop":
                if self.freeze is not None:
                    await self.freeze()
                else:
                    stop_self()
            elif rule.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif interrupt is None:
                await asyncio.sleep(rule.seconds)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(interrupt.wait(), rule.seconds)


def stop_self() -> None:
    """SIGSTOP this process (it resumes on SIGCONT), stopping the calling thread before it runs another line.

    `kill(getpid(), SIGSTOP)` may be delivered through another thread, and the caller can run on for a
    moment (long enough to open the next database transaction and freeze holding its lock). Sent to the
    calling thread itself, the stop takes effect as the system call returns.
    """
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
