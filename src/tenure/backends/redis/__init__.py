"""Redis backends on a single Redis server (not Redis Cluster): named lease slots (`RedisLeases`) and the live
channel (`RedisChannel`, pub/sub)."""

from tenure.backends.redis.channel import RedisChannel
from tenure.backends.redis.leases import RedisLeases
from tenure.backends.redis.ready_index import RedisReadyIndex

__all__ = ["RedisChannel", "RedisLeases", "RedisReadyIndex"]
