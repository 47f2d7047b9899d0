from __future__ import annotations

import pytest

from tenure.contracts.errors import ConfigError
from tenure.settings import Settings


def test_defaults_are_the_documented_ones() -> None:
    s = Settings.from_env({})
    assert (s.store.database_url, s.worker.heartbeat_s, s.worker.claim_ttl_s) == ("sqlite:///./tenure.db", 5.0, 15.0)


def test_environment_is_typed_and_flags_override_it() -> None:
    s = Settings.from_env({"TENURE_HEARTBEAT_S": "2", "TENURE_CLAIM_TTL_S": "6", "TENURE_CONCURRENCY": "4"}, concurrency=8)
    assert (s.worker.heartbeat_s, s.worker.claim_ttl_s, s.worker.concurrency) == (2.0, 6.0, 8)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TENURE_NOPE": "1"}, "unknown setting TENURE_NOPE"),
        ({"TENURE_HEARTBEAT_S": "soon"}, "must be a number"),
        ({"TENURE_HEARTBEAT_S": "-1"}, "positive"),
        ({"TENURE_HEARTBEAT_S": "nan"}, "positive"),
        ({"TENURE_CONCURRENCY": "0"}, "at least 1"),
        ({"TENURE_CLAIM_TTL_S": "14"}, "at least 3 heartbeats"),
        ({"TENURE_DATABASE_URL": "mysql://x"}, "expected sqlite"),
        ({"TENURE_SQLITE_SYNCHRONOUS": "OFF"}, "must be one of FULL, NORMAL"),
        ({"TENURE_LOG_LEVEL": "loud"}, "must be one of"),
    ],
)
def test_bad_settings_are_errors_at_start_up(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)
