"""Results and artifacts over HTTP (docs/artifacts.md), streamed, never read whole into the gateway's memory:

    GET /v1/jobs/{id}/result     the result's JSON text: inline from the row, or its artifact streamed
    GET /v1/artifacts/{ref}      one artifact (a result's or an evidence record's) by its `<job id>.<sha256>`

Both are tenant-checked through the job that owns the artifact: another tenant's job, and so its artifacts, is
answered like a missing one (404). Both answer `Content-Length` and the SHA-256 of the body as the `ETag` (an
`If-None-Match` with it gets 304).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tenure.contracts.artifacts import ArtifactStore, Blob, parse_ref, stub_ref
from tenure.contracts.states import JobState
from tenure.contracts.text import dumps
from tenure.contracts.types import Job, is_uuid
from tenure.control.models import shown
from tenure.gateway.problems import Problem

JSON = "application/json"


def _not_found(what: str) -> Problem:
    return Problem(404, "Not found", f"no {what}", "not-found")


def _cached(request: Request, digest: str) -> Response | None:
    tags = request.headers.get("if-none-match")
    if tags and (tags.strip() == "*" or f'"{digest}"' in tags):
        return Response(status_code=304, headers={"ETag": f'"{digest}"'})
    return None


async def _stream(blob: Blob) -> AsyncIterator[bytes]:
    try:
        async for chunk in blob.chunks:
            yield chunk
    finally:
        await blob.close()


async def blob_response(request: Request, artifacts: ArtifactStore | None, owner: str, digest: str) -> Response:
    """Stream the artifact `digest` of job `owner` (the caller already may see the job), or 404."""
    cached = _cached(request, digest)
    if cached is not None:
        return cached
    blob = None if artifacts is None else await artifacts.open(owner, digest)
    if blob is None:
        raise _not_found(f"artifact {owner}.{digest}")
    headers = {"Content-Length": str(blob.size), "ETag": f'"{digest}"', "Cache-Control": "private"}
    if request.method == "HEAD":
        await blob.close()
        return Response(headers=headers, media_type=JSON)
    return StreamingResponse(_stream(blob), headers=headers, media_type=JSON)


async def result_response(request: Request, artifacts: ArtifactStore | None, job: Job) -> Response:
    """GET /v1/jobs/{id}/result for a job the caller may see: 409 unless it succeeded."""
    if job.state is not JobState.SUCCEEDED:
        raise Problem(409, "No result", f"job {job.id} is {job.state.value}: only a succeeded job has a result", "no-result")
    ref = stub_ref(job.result)
    if ref is not None and ref.owner == job.id:
        return await blob_response(request, artifacts, ref.owner, ref.sha256)
    body = dumps(job.result).encode("utf-8")
    digest = hashlib.sha256(body).hexdigest()
    cached = _cached(request, digest)
    if cached is not None:
        return cached
    return Response(body, media_type=JSON, headers={"ETag": f'"{digest}"', "Cache-Control": "private"})


async def artifact_response(
    request: Request, artifacts: ArtifactStore | None, load_job: Callable[[str], Awaitable[Job]]
) -> Response:
    """GET /v1/artifacts/{ref}: `load_job(owner)` answers 404 for a job the caller may not see."""
    text = request.path_params["ref"]
    parsed = parse_ref(text)
    if parsed is None or not is_uuid(parsed[0]):
        raise _not_found(f"artifact {shown(text)} (a reference is <job id>.<sha256>)")
    job = await load_job(parsed[0])
    return await blob_response(request, artifacts, job.id, parsed[1])


__all__ = ["artifact_response", "blob_response", "result_response"]
