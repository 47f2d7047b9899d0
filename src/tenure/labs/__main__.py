"""`python -m tenure.labs NAME --dir DIR --params JSON`: run one lab (see tenure/labs/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from tenure.labs._harness import Harness, emit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tenure.labs")
    parser.add_argument("lab", choices=["loop", "owner", "lease"])
    parser.add_argument("--dir", required=True, help="a directory of its own (the throw-away store, worker logs)")
    parser.add_argument("--params", default="{}", help="the lab's parameters as a JSON object")
    args = parser.parse_args(argv)
    params = json.loads(args.params)
    if args.lab == "loop":
        from tenure.labs.loop import run
    elif args.lab == "owner":
        from tenure.labs.owner import run
    else:
        from tenure.labs.lease import run
    h = Harness(Path(args.dir))

    async def go() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        await run(h, params)

    try:
        asyncio.run(go())
    except (asyncio.CancelledError, KeyboardInterrupt):
        emit("error", text="stopped")
        return 143
    except Exception as exc:
        emit("error", text=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        h.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
