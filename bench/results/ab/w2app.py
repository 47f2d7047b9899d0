import time
import redis.asyncio
import tenure

app = tenure.Tenure()
_r = None


@app.agent("w2")
async def w2(ctx, input):
    t = time.time()
    global _r
    if _r is None:
        _r = redis.asyncio.Redis()
    await _r.hset("perf-w2", str(input["i"]), repr(t))
