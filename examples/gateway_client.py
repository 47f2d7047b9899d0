"""Drive a running gateway with the Python client: submit, follow, resume, cancel, input, approve.

tenure up &                                    # gateway on 127.0.0.1:8000, workers, tenure.demos.examples:app
python examples/gateway_client.py [URL]
"""

from __future__ import annotations

import asyncio
import sys

from tenure.client import Client, GatewayError


async def main(url: str) -> None:
    async with Client(url) as c:
        # 1. submit with an idempotency key: a replay answers the same job
        job = (await c.submit("sleep", {"seconds": 1, "every": 0.25}, idempotency_key="example-sleep")).job
        again = await c.submit("sleep", {"seconds": 1, "every": 0.25}, idempotency_key="example-sleep")
        print("job", job.id, "replay gives the same job:", again.job.id == job.id, "created:", again.created)

        # 2. follow the live stream; stop early, then resume from the last id: no gap, no duplicate
        seen = []
        async for e in c.stream(job):
            seen.append(e)
            if len(seen) == 2:
                break
        async for e in c.stream(job, after=seen[-1].cursor):
            seen.append(e)
        print("events:", [f"{e.cursor} {e.type}" for e in seen])

        # 3. cancel a long job
        long = await c.submit("sleep", {"seconds": 60})
        await asyncio.sleep(0.5)
        print("cancel:", await c.cancel(long, wait=10))

        # 4. a conversation: the job waits (holding no worker slot) for each input
        conv = await c.submit("converse")
        for text in ("hello", "how are you?", "bye"):
            await c.send_input(conv, text)
        print("converse:", (await c.wait(conv, 30)).result)

        # 5. an approval
        pub = await c.submit("publish", {"title": "release notes"})
        await c.approve(pub, True, "ship it")
        print("publish:", (await c.wait(pub, 30)).result)

        # 6. errors are problems
        try:
            await c.submit("no-such-agent")
        except GatewayError as exc:
            print("refused:", exc.status, exc.problem["detail"])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"))
