"""`python -m tenure.demos.labs NAME --dir DIR --params JSON`: run one lab (see tenure/demos/labs/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from tenure.demos.labs._harness import Harness, emit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tenure.demos.labs")
    parser.add_argument("lab", choices=["loop", "owner", "lease"])
    parser.add_argument("--dir", required=True, help="a directory of its own (the throw-away store, worker logs)")
    parser.add_argument("--params", default="{}", help="the lab's parameters as a JSON object")
    args = parser.parse_args(argv)
    params = json.loads(args.params)
    if args.lab == "loop":
        from tenure.demos.labs.loop import run
    elif args.lab == "owner":
        from tenure.demos.labs.owner import run
    else:
        from tenure.demos.labs.lease import run
    h = Harness(Path(args.dir))

    parent = os.getppid()

    async def orphaned() -> None:
        # The gateway that started this lab died without stopping it: stop now rather than at the lab's end.
        while os.getppid() == parent:  # noqa: ASYNC110 (no event tells of a parent's death; a poll does)
            await asyncio.sleep(0.5)
        emit("error", text="the gateway that started this lab is gone")

    async def go() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        async with asyncio.TaskGroup() as tg:
            lab = tg.create_task(run(h, params), name="lab")
            watch = tg.create_task(orphaned(), name="lab-parent")
            await asyncio.wait({lab, watch}, return_when=asyncio.FIRST_COMPLETED)
            lab.cancel()
            watch.cancel()

    try:
        asyncio.run(go())
    except (asyncio.CancelledError, KeyboardInterrupt):
        emit("error", text="stopped")
        return 143
    except Exception as exc:
        while isinstance(exc, ExceptionGroup):  # the lab's own error, out of its task group
            exc = exc.exceptions[0]
        emit("error", text=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        h.kill_all()
        shutil.rmtree(h.directory, ignore_errors=True)  # the gateway removes it too; this covers a gateway that died
    return 0


if __name__ == "__main__":
    sys.exit(main())
