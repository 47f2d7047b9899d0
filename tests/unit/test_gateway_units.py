"""Pure pieces of the gateway: the stream cursor rule, live-event de-duplication, API key tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenure.contracts.errors import ConfigError
from tenure.contracts.types import Event
from tenure.gateway.auth import Auth
from tenure.gateway.streams import EventHub, continues


def ev(epoch: int, seq: int, type: str = "x") -> Event:
    return Event("job", None, epoch, seq, type, None, 0.0)


def test_an_event_continues_a_cursor_only_at_the_next_seq_or_the_first_of_a_newer_epoch() -> None:
    assert continues(None, ev(1, 1)) and not continues(None, ev(1, 2))
    assert continues((1, 4), ev(1, 5)) and not continues((1, 4), ev(1, 6)) and not continues((1, 4), ev(1, 4))
    assert continues((1, 4), ev(2, 1)) and not continues((1, 4), ev(2, 2))
    assert not continues((2, 1), ev(1, 5))  # an older epoch never continues a newer cursor


def test_live_events_drop_duplicates_and_older_epochs_and_turn_gaps_into_history_reads() -> None:
    hub = EventHub(store=None, signals=None, idle_s=5.0)  # type: ignore[arg-type]  # neither is touched here
    sub = hub.subscribe("job", (2, 3))
    sub._dirty, sub._primed = False, True
    sub.push([ev(2, 3), ev(1, 9), ev(2, 5), ev(2, 4)])  # a duplicate, an older epoch, out of order
    assert [(e.epoch, e.seq) for e in sub._take_live()] == [(2, 4), (2, 5)]
    assert not sub._dirty
    sub.cursor = (2, 5)
    sub.push([ev(2, 8)])  # 6 and 7 are missing: read the history instead
    assert sub._take_live() == [] and sub._dirty


def test_api_keys_map_to_tenants_by_digest_and_refuse_ambiguity(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# tenants\ntenant-c:key-c-0123456789\n")
    auth = Auth.from_settings(
        {
            "api_keys": "tenant-a:key-a-0123456789, tenant-b:key-b-0123456789",
            "api_keys_file": str(keys),
            "admin_key": "admin-0123456789",
        }
    )
    assert auth.enabled
    assert auth.authenticate("Bearer key-a-0123456789").tenant == "tenant-a"  # type: ignore[union-attr]
    assert auth.authenticate("bearer key-c-0123456789").tenant == "tenant-c"  # type: ignore[union-attr]
    admin = auth.authenticate("Bearer admin-0123456789")
    assert admin is not None and admin.is_admin and admin.submit_tenant == "default"
    assert auth.authenticate("Bearer nope-0123456789") is None and auth.authenticate(None) is None
    assert auth.authenticate("Basic key-a-0123456789") is None
    assert "key-a-0123456789" not in repr(vars(auth))  # only digests are kept
    open_auth = Auth.from_settings({})
    assert not open_auth.enabled and open_auth.authenticate(None).tenant == "default"  # type: ignore[union-attr]
    with pytest.raises(ConfigError):
        Auth.from_settings({"api_keys": "tenant-a:short"})
    with pytest.raises(ConfigError):
        Auth.from_settings({"api_keys": "a:same-key-0123,b:same-key-0123"})
    with pytest.raises(ConfigError):
        Auth.from_settings({"api_keys": "nokey"})
