"""One WebSocket, several jobs: submit two jobs and watch both streams on the same socket.

tenure up &
python examples/ws_client.py [ws://127.0.0.1:8000/v1/ws]
"""

from __future__ import annotations

import asyncio
import json
import sys

import websockets


async def main(url: str) -> None:
    async with websockets.connect(url) as ws:
        await ws.send(
            json.dumps(
                {
                    "op": "submit",
                    "ref": "long",
                    "agent": "sleep",
                    "input": {"seconds": 2, "every": 0.5},
                    "subscribe": True,
                }
            )
        )
        await ws.send(json.dumps({"op": "submit", "ref": "short", "agent": "echo", "input": {"hi": 1}, "subscribe": True}))
        ended = 0
        while ended < 2:
            frame = json.loads(await ws.recv())
            if frame["op"] == "event":
                e = frame["event"]
                print(f"{frame['job_id'][-8:]}  {e['id']:>6}  {e['type']:18} {json.dumps(e['payload'])}")
            elif frame["op"] == "end":
                ended += 1
            else:
                print(frame["op"], frame.get("ref", ""))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8000/v1/ws"))
