"""What every Redis client of Tenure passes when it is created.

redis-py reads its own version from the package metadata (a file read) on every new connection unless it is
told the version; on the event loop that is a blocking call. redis-py 6+ takes it as `driver_info`, 5.x as
`lib_version`: both are supported, so Tenure runs beside libraries that still pin redis 5 (arq, for one).
"""

from __future__ import annotations

from typing import Any

import redis


def _identity() -> dict[str, Any]:
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py 5.x
        return {"lib_version": redis.__version__}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


_IDENTITY = _identity()  # decided at import, never on the event loop


def client_identity() -> dict[str, Any]:
    """Keyword arguments for `redis.asyncio.Redis(...)` / `from_url(...)`."""
    return dict(_IDENTITY)
