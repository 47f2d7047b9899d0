"""An S3-compatible server for the artifact store's tests, started as a process of its own over real HTTP.

It is moto's server (`moto[server]`, in the dev extra): an emulator of the S3 API, not S3 itself nor MinIO (no
real S3-compatible server installs on this machine from PyPI, Debian or npm: MinIO, Garage and SeaweedFS are not
packaged, Debian's radosgw wants a Ceph cluster, npm's s3rver is an emulator too). What it shows is that the
store speaks the S3 protocol through boto3 over HTTP (signing, streamed bodies, paging, DeleteObjects); what only
a real server would show (checksum verification, which moto skips; the 1,000-key limit; consistency under load)
it does not. A missing moto fails the tests that need it: never a skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tenure-test-key",
    "AWS_SECRET_ACCESS_KEY": "tenure-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probe when a test runs without credentials
}
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    """A running `moto.server` on a free loopback port."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path

    @classmethod
    def start(cls, log_dir: Path, env: dict[str, str] | None = None) -> S3Server:
        port = free_port()
        log_path = log_dir / f"moto-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **CREDENTIALS, **(env or {})},
                start_new_session=True,
            )
        server = cls(proc, f"http://127.0.0.1:{port}", log_path)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the S3 server (moto) exited with {proc.returncode}: {server.log()}")
            try:
                with urllib.request.urlopen(server.endpoint + "/moto-api/", timeout=1):
                    return server
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        server.stop()
        raise RuntimeError(f"the S3 server (moto) did not answer within 60 s: {server.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def client(self) -> Any:
        """A boto3 client of the test's own (to create buckets and look at keys), not the store's."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client("s3", endpoint_url=self.endpoint)


@dataclass
class S3Bucket:
    """A fresh bucket of one test on the server; `url` is what TENURE_ARTIFACTS_URL takes."""

    server: S3Server
    name: str
    prefix: str = "tenure-test"

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}?endpoint={self.server.endpoint}&region={REGION}"

    def keys(self) -> list[str]:
        """Every key under the prefix, as the server lists them."""
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=self.prefix + "/")
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def size(self, owner: str, sha256: str) -> int | None:
        """The size of one stored object, or None when there is none."""
        try:
            head = self.server.client().head_object(Bucket=self.name, Key=f"{self.prefix}/{owner}/{sha256}")
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise
        return int(head["ContentLength"])


def new_bucket(server: S3Server) -> Iterator[S3Bucket]:
    """A bucket named for one test, created on the server (left there: the server dies with the session)."""
    name = f"tenure-{uuid.uuid4().hex[:20]}"
    server.client().create_bucket(Bucket=name)
    yield S3Bucket(server, name)
