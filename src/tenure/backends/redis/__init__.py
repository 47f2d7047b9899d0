"""Redis backends on a single Redis server (not Redis Cluster): named lease slots (`RedisLeases`) and the live
channel (`RedisChannel`, pub/sub)."""

from tenure.backends.redis.channel import RedisChannel
from tenure.backends.redis.leases import RedisLeases

__all__ = ["RedisChannel", "RedisLeases"]
