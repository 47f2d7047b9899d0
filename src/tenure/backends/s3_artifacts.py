"""The artifact store in an S3-compatible bucket (docs/artifacts.md): keys `<prefix>/<owner>/<sha256>`.

The same layout as the directory store, one "folder" per job, so the collector deletes one key prefix per job.
The client is boto3 (the optional extra `tenure[s3]`), imported only when the first call needs it, so `import
tenure` and every process without an S3 URL never load it. boto3 is blocking: every call (the import and the
client's creation included) runs in `asyncio.to_thread`, and a read pulls `CHUNK_BYTES` at a time from the
response body, so the event loop never waits on the network and a stream never holds a whole object.

A write is one `PutObject` carrying the SHA-256 the worker computed (`ChecksumSHA256`): the server refuses the
object unless the bytes it received have that digest, and S3 makes a whole object visible or none. The
reference's digest is always the local one, never an ETag (a multipart ETag is not a digest of the bytes). The
largest artifact (`TENURE_MAX_RESULT_BYTES`, 1 GiB by default) is under S3's 5 GiB limit for one `PutObject`.

Every failure of the client (unreachable endpoint, access denied, no such bucket, a timeout mid-read) is
translated here into `ArtifactsUnavailable`, a `StoreUnavailable`; a missing key is `None`. Credentials come
from boto3's standard chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, the shared files,
an instance role); they are never part of the URL and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from tenure.contracts.artifacts import CHUNK_BYTES, ArtifactRef, Blob, valid_owner
from tenure.contracts.errors import ArtifactsUnavailable, ConfigError

T = TypeVar("T")
DELETE_BATCH = 1000
"""DeleteObjects takes at most 1,000 keys a request (S3's limit)."""

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_OPTIONS = frozenset({"endpoint", "region", "addressing"})
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


@dataclass(frozen=True, slots=True)
class S3Location:
    """A parsed `s3://BUCKET/PREFIX?endpoint=URL&region=NAME&addressing=path|virtual`."""

    bucket: str
    prefix: str  # "" or "a/b/" (always ends with "/" when set)
    endpoint: str | None = None
    region: str | None = None
    addressing: str | None = None  # None: path-style with an endpoint (MinIO and most compatibles), else boto3's

    def __str__(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return f"{where} at {self.endpoint}" if self.endpoint else where


def parse_s3_url(url: str, setting: str = "TENURE_ARTIFACTS_URL") -> S3Location:
    """`s3://BUCKET/PREFIX?endpoint=http://host:port&region=...&addressing=path` → its parts; a malformed URL, an
    unknown option or credentials in the URL are a `ConfigError` (whose message never repeats a secret)."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ConfigError(f"{setting}: expected s3://BUCKET/PREFIX?endpoint=...&region=..., not a {parts.scheme!r} URL")
    if "@" in parts.netloc:
        raise ConfigError(
            f"{setting}: credentials do not go in the URL; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead"
        )
    bucket = parts.netloc
    if _BUCKET.fullmatch(bucket) is None:
        raise ConfigError(f"{setting}: {bucket!r} is not a bucket name (3-63 of a-z, 0-9, '.', '-')")
    prefix = parts.path.strip("/")
    if "//" in prefix or any(p in (".", "..") for p in prefix.split("/")):
        raise ConfigError(f"{setting}: the prefix {prefix!r} has an empty, '.' or '..' segment")
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)):
        if name not in _OPTIONS:
            raise ConfigError(f"{setting}: unknown option {name!r} (known: {', '.join(sorted(_OPTIONS))})")
        options[name] = value
    endpoint = options.get("endpoint") or None
    if endpoint is not None:
        e = urlsplit(endpoint)
        if e.scheme not in ("http", "https") or not e.netloc or "@" in e.netloc:
            raise ConfigError(f"{setting}: endpoint must be http(s)://host[:port] without credentials")
    addressing = options.get("addressing") or None
    if addressing not in (None, "path", "virtual"):
        raise ConfigError(f"{setting}: addressing is 'path' or 'virtual', not {addressing!r}")
    return S3Location(bucket, prefix + "/" if prefix else "", endpoint, options.get("region") or None, addressing)


class S3Artifacts:
    """Artifacts as objects of one bucket under one prefix. The boto3 client is made on first use (in a thread)
    and shared by the threads of this instance (botocore clients are thread-safe)."""

    delete_batch = DELETE_BATCH

    def __init__(self, where: S3Location) -> None:
        self.where = where
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return str(self.where)

    def _key(self, owner: str, sha256: str = "") -> str:
        if not valid_owner(owner):
            raise ValueError(f"an artifact owner is a job id, not {owner!r}")
        return f"{self.where.prefix}{owner}/{sha256}"

    # -- the client, in threads --------------------------------------------------------------------------------------
    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError as exc:
                    raise ConfigError(
                        "TENURE_ARTIFACTS_URL names an S3 bucket but boto3 is not installed: pip install 'tenure[s3]'"
                    ) from exc
                addressing = self.where.addressing or ("path" if self.where.endpoint else "auto")
                config = Config(
                    s3={"addressing_style": addressing},
                    retries={"max_attempts": 3, "mode": "standard"},
                    connect_timeout=5,
                    read_timeout=60,
                    # only what S3 requires (DeleteObjects): many S3-compatible servers reject the CRC32 that
                    # newer botocore adds to every request; a put carries its own SHA-256 checksum anyway
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                )
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.where.endpoint, region_name=self.where.region, config=config
                )
            return self._client

    async def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(self._translated, what, fn, *args)

    def _translated(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except (ConfigError, ValueError, ArtifactsUnavailable):
            raise
        except Exception as exc:  # botocore's and urllib3's errors: the client library's, translated at the edge
            raise ArtifactsUnavailable(f"the artifact store {self.location} failed to {what}: {_describe(exc)}") from exc

    # -- write -------------------------------------------------------------------------------------------------------
    async def put(self, owner: str, data: bytes) -> ArtifactRef:
        return await self._call("store an artifact", self._put, owner, data)

    def _put(self, owner: str, data: bytes) -> ArtifactRef:
        raw = hashlib.sha256(data).digest()
        ref = ArtifactRef(owner, raw.hex(), len(data))
        key, s3 = self._key(owner, ref.sha256), self._s3()
        if self._head(s3, key) == len(data):
            return ref  # already there: the key is the content's digest
        s3.put_object(
            Bucket=self.where.bucket,
            Key=key,
            Body=data,
            ContentLength=len(data),
            ContentType="application/json",
            ChecksumSHA256=base64.b64encode(raw).decode("ascii"),  # the server checks the bytes against it
        )
        return ref

    def _head(self, s3: Any, key: str) -> int | None:
        try:
            return int(s3.head_object(Bucket=self.where.bucket, Key=key)["ContentLength"])
        except Exception as exc:
            if _missing(exc):
                return None
            raise

    # -- read --------------------------------------------------------------------------------------------------------
    async def open(self, owner: str, sha256: str) -> Blob | None:
        if not valid_owner(owner) or _SHA256.fullmatch(sha256) is None:
            return None
        body = await self._call("open an artifact", self._get, self._key(owner, sha256))
        if body is None:
            return None
        stream, size = body
        return Blob(size, sha256, self._chunks(stream), stream.close)

    def _get(self, key: str) -> tuple[Any, int] | None:
        try:
            got = self._s3().get_object(Bucket=self.where.bucket, Key=key)
        except Exception as exc:
            if _missing(exc):
                return None
            raise
        return got["Body"], int(got["ContentLength"])

    async def _chunks(self, stream: Any) -> AsyncIterator[bytes]:
        try:
            while True:
                chunk: bytes = await self._call("read an artifact", stream.read, CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        finally:
            stream.close()

    # -- collect -----------------------------------------------------------------------------------------------------
    async def delete_owners(self, owners: Sequence[str]) -> int:
        return await self._call("delete artifacts", self._delete_owners, [self._key(o) for o in owners])

    def _delete_owners(self, prefixes: list[str]) -> int:
        s3, bucket, deleted, batch = self._s3(), self.where.bucket, 0, []
        for prefix in prefixes:  # one listing per job; the keys of several jobs share a DeleteObjects batch
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    batch.append({"Key": item["Key"]})
                    if len(batch) == self.delete_batch:
                        deleted += self._delete(s3, batch)
                        batch = []
        if batch:
            deleted += self._delete(s3, batch)
        return deleted

    def _delete(self, s3: Any, batch: list[dict[str, str]]) -> int:
        answer = s3.delete_objects(Bucket=self.where.bucket, Delete={"Objects": batch, "Quiet": True})
        errors = answer.get("Errors") or []
        if errors:
            first = errors[0]
            raise ArtifactsUnavailable(
                f"the artifact store {self.location} refused to delete {len(errors)} of {len(batch)} objects "
                f"({first.get('Code')}: {first.get('Message')}, e.g. {first.get('Key')})"
            )
        return len(batch)

    async def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def _missing(exc: BaseException) -> bool:
    return _code(exc) in _MISSING


def _describe(exc: BaseException) -> str:
    """One line: the S3 error code and message, or the client's own (never the request's signed headers)."""
    code = _code(exc)
    if code is not None:
        message = getattr(exc, "response", {}).get("Error", {}).get("Message") or ""
        return f"{code}{': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"


__all__ = ["DELETE_BATCH", "S3Artifacts", "S3Location", "parse_s3_url"]
