"""API keys: `Authorization: Bearer <key>` maps to a tenant, or to the admin who sees every tenant.

Keys come from `TENURE_API_KEYS='tenant-a:KEY1,tenant-b:KEY2'`, a file named by `TENURE_API_KEYS_FILE` (one
`tenant:key` a line, `#` comments) and `TENURE_ADMIN_KEY`. Only SHA-256 digests of the keys are kept in
memory, and a presented key is compared by digest in constant time. With no key configured the gateway is
open (every request is tenant `default`) and must bind to a loopback address.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tenure.contracts.errors import ConfigError
from tenure.contracts.types import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a tenant, or the admin (`tenant` None: sees every tenant, submits as `default`)."""

    tenant: str | None

    @property
    def submit_tenant(self) -> str:
        return self.tenant or DEFAULT_TENANT

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Auth:
    """The key table. `Auth.open()` accepts everyone as tenant `default` (loopback-only deployments)."""

    def __init__(self, tenants: Mapping[bytes, str], admin: bytes | None) -> None:
        self._tenants = dict(tenants)
        self._admin = admin

    @classmethod
    def open(cls) -> Auth:
        return cls({}, None)

    @property
    def enabled(self) -> bool:
        return bool(self._tenants) or self._admin is not None

    @classmethod
    def from_settings(cls, extra: Mapping[str, str]) -> Auth:
        """Read `api_keys`, `api_keys_file` and `admin_key` (the TENURE_* variables, without the prefix)."""
        pairs: list[tuple[str, str, str]] = []
        if extra.get("api_keys", "").strip():
            for i, item in enumerate(extra["api_keys"].split(",")):
                if item.strip():
                    pairs.append((*_pair(item, f"TENURE_API_KEYS item {i + 1}"),))
        path = extra.get("api_keys_file", "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"TENURE_API_KEYS_FILE {path!r}: {exc.strerror}") from exc
            for n, line in enumerate(lines, start=1):
                line = line.strip()
                if line and not line.startswith("#"):
                    pairs.append((*_pair(line, f"{path} line {n}"),))
        tenants: dict[bytes, str] = {}
        for tenant, key, _where in pairs:
            d = _digest(key)
            if d in tenants and tenants[d] != tenant:
                raise ConfigError(f"one API key is given to two tenants ({tenants[d]!r} and {tenant!r})")
            tenants[d] = tenant
        admin_key = extra.get("admin_key", "").strip()
        admin = _digest(admin_key) if admin_key else None
        if admin is not None and admin in tenants:
            raise ConfigError("TENURE_ADMIN_KEY is also a tenant's key")
        return cls(tenants, admin)

    def principals(self) -> list[tuple[bytes, Principal]]:
        """Every configured key, as (SHA-256 digest, who it is): what a session cookie is bound to."""
        out = [(d, Principal(t)) for d, t in self._tenants.items()]
        if self._admin is not None:
            out.append((self._admin, Principal(None)))
        return out

    def tenant_names(self) -> list[str]:
        """The tenants that have a key (for the admin's searches by idempotency key)."""
        return sorted(set(self._tenants.values()))

    def authenticate_key(self, key: str) -> tuple[Principal, bytes] | None:
        """The caller holding `key` and the key's digest, or None when it is not accepted (a login form's key)."""
        p = self.authenticate(f"Bearer {key}")
        return None if p is None or not self.enabled else (p, _digest(key.strip()))

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller of a request with this `Authorization` header, or None when it is not accepted."""
        if not self.enabled:
            return Principal(DEFAULT_TENANT)
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        d = _digest(key.strip())
        if self._admin is not None and hmac.compare_digest(d, self._admin):
            return Principal(None)
        tenant = self._tenants.get(d)  # a dict lookup by digest: the key itself is never compared
        return None if tenant is None else Principal(tenant)


def _pair(text: str, where: str) -> tuple[str, str, str]:
    tenant, sep, key = text.strip().partition(":")
    if not sep or not tenant.strip() or not key.strip():
        raise ConfigError(f"{where}: expected tenant:key")
    if len(key.strip()) < 8:
        raise ConfigError(f"{where}: an API key needs at least 8 characters")
    return tenant.strip(), key.strip(), where
