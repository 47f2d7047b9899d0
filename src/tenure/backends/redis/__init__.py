"""Redis backends: named lease slots (`RedisLeases`) on a single Redis server (not Redis Cluster)."""

from tenure.backends.redis.leases import RedisLeases

__all__ = ["RedisLeases"]
