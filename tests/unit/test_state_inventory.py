"""docs/state-inventory.md stays honest: every module-level or per-object mutable container in src/tenure is
either listed there (by name, in a row that says what happens to it with many replicas) or allowed here by name
as a constant or as state scoped to one call, request or execution. Adding one without a row fails this test.

The scan is syntactic: a module-level name, or a `self.<attr>` assigned in a method, whose value is a mutable
container (a dict, list or set display or comprehension, or a call of dict, list, set, deque, Counter,
defaultdict, OrderedDict, Queue, a Weak* collection or a prometheus Counter).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

SRC = ROOT / "src" / "tenure"
DOC = ROOT / "docs" / "state-inventory.md"
_MUTABLE_CALLS = {
    "dict", "list", "set", "deque", "Counter", "defaultdict", "OrderedDict", "Queue", "bytearray", "WeakSet",
    "WeakValueDictionary", "WeakKeyDictionary",
}  # fmt: skip

# Listed in docs/state-inventory.md: the attribute's name must appear in the page (in its row).
ROW = "row"
# Never changed after import, or living only as long as one call, request, stream or execution.
CONSTANT = "constant"
SCOPED = "scoped"

_METRICS = (
    "BLOCKING_COMPLETED", "BLOCKING_FAILED_CLOSED", "BLOCKING_REJECTED", "CLAIM_FAILURES", "DEGRADED", "HEARTBEATS_LATE",
    "JOBS_DEAD", "JOBS_FINISHED", "JOBS_LOST", "LOOP_STALLS", "QUOTA_FAIL_OPEN", "QUOTA_REJECTED", "RETRIES",
    "SOFT_TIMEOUTS", "SWEEPS", "WORKERS_LOST",
)  # fmt: skip

_METRICS = (
    "BLOCKING_COMPLETED", "BLOCKING_FAILED_CLOSED", "BLOCKING_REJECTED", "CLAIM_FAILURES", "DEGRADED", "HEARTBEATS_LATE",
    "JOBS_DEAD", "JOBS_FINISHED", "JOBS_LOST", "LOOP_STALLS", "QUOTA_FAIL_OPEN", "QUOTA_REJECTED", "RETRIES",
    "SOFT_TIMEOUTS", "SWEEPS", "WORKERS_LOST",
)  # fmt: skip

ALLOWED: dict[str, str] = {
    # -- in docs/state-inventory.md
    "tenure.backends.postgres.signals.PostgresSignals._control_jobs": ROW,
    "tenure.worker.audit.ExecutionAudit._steps": ROW,
    "tenure.control.routing.LocalPath.pending": ROW,
    "tenure.worker.audit.ExecutionAudit._used": ROW,
    "tenure.worker.children.ExecutionChildren.spawned": ROW,
    "tenure.worker.record.Record.durations": ROW,
    "tenure.worker.timeouts.DurationWindow._order": ROW,
    "tenure.worker.timeouts.DurationWindow._sorted": ROW,
    "tenure.worker.completer.Completer._records": ROW,
    "tenure.backends.postgres.signals.PostgresSignals._notices": ROW,
    "tenure.backends.redis.ready_index.RedisReadyIndex._groups": ROW,
    "tenure.backends.signals.ChannelSignals._outbox": ROW,
    "tenure.backends.signals._Feed.jobs": ROW,
    "tenure.backends.sqlite.doorbell.Watch._events": ROW,
    "tenure.backends.sqlite._connection.ConnectionThread._pending": ROW,
    "tenure.backends.sqlite.signals.SqliteSignals._bells": ROW,
    "tenure.backends.sqlite.signals.SqliteSignals._watched": ROW,
    "tenure.contracts.types._id_last": ROW,
    "tenure.control.admission.InFlight._pending": ROW,
    "tenure.control.directory.AgentDirectory._specs": ROW,
    "tenure.control.directory.AgentDirectory.routed": ROW,
    "tenure.control.routing.RouteChooser._quiet": ROW,
    "tenure.gateway.ui.labs.LabRunner._env": ROW,
    "tenure.gateway.ui.labs.LabRunner._runs": ROW,
    "tenure.gateway.ui.sessions.Sessions._keys": ROW,
    "tenure.control.quotas.QuotaManager._held": ROW,
    "tenure.control.quotas.QuotaManager._to_announce": ROW,
    "tenure.control.quotas.QuotaManager._waiters": ROW,
    "tenure.control.quotas.QuotaManager.fail_open_admitted": ROW,
    "tenure.control.quotas.QuotaManager.rejected": ROW,
    "tenure.control.quotas.QuotaManager.rejections": ROW,
    "tenure.gateway.auth.Auth._tenants": ROW,
    "tenure.gateway.streams.EventHub._subs": ROW,
    "tenure.gateway.ws.WsSession.subs": ROW,
    "tenure.gateway.ws.WsSession.out": ROW,
    "tenure.kernel.blocking._BoundedOffload._abandoned": ROW,
    "tenure.kernel.blocking._BoundedOffload._running": ROW,
    "tenure.kernel.blocking._BoundedOffload._waiters": ROW,
    "tenure.kernel.lag.LagSampler._beats": ROW,
    "tenure.kernel.lag.LagSampler._reports": ROW,
    "tenure.kernel.lag.LagSampler._samples": ROW,
    "tenure.observability.logs._process_fields": ROW,
    "tenure.worker.claiming.WorkerQuotaGate._slots": ROW,
    "tenure.worker.completer.Completer._events": ROW,
    "tenure.worker.completer.Completer._finishes": ROW,
    "tenure.worker.completer.Completer._flushes": ROW,
    "tenure.worker.held.Held.claimed": ROW,
    "tenure.worker.held.Held.running": ROW,
    "tenure.worker.observe.WorkerObserver._claimed_at": ROW,
    "tenure.worker.observe.WorkerObserver._children": ROW,
    "tenure.worker.observe.WorkerObserver._health_tables": ROW,
    "tenure.worker.observe.WorkerObserver._late_samples": ROW,
    "tenure.worker.observe.WorkerObserver._lost_workers": ROW,
    "tenure.worker.observe.WorkerObserver._quota_fail_open_seen": ROW,
    "tenure.worker.observe.WorkerObserver._quota_rejections_seen": ROW,
    "tenure.worker.observe.WorkerObserver._started_mono": ROW,
    "tenure.worker.observe.WorkerObserver._tenants_seen": ROW,
    "tenure.worker.worker.Worker.abandoned": ROW,
    "tenure.worker.worker.Worker._tasks": ROW,
    # metric objects: the "metric values" row (prometheus_client's registry)
    **{f"tenure.observability.metrics.{name}": CONSTANT for name in _METRICS},
    # -- constants: built at import (or construction) and never changed
    "tenure.backends.postgres.channel._SETTINGS": CONSTANT,
    "tenure.contracts.states.TRANSITIONS": CONSTANT,
    "tenure.backends.sqlite._state_pages.STATE_PAGES": CONSTANT,
    "tenure.control.admission.Admission.agents": CONSTANT,
    "tenure.control.json_input._CONTAINERS": CONSTANT,
    "tenure.control.quotas.QuotaManager.specs": CONSTANT,
    "tenure.gateway.openapi._COMMON": CONSTANT,
    "tenure.gateway.openapi._COMMAND": CONSTANT,
    "tenure.gateway.openapi._CURSOR": CONSTANT,
    "tenure.gateway.openapi._MODELS": CONSTANT,
    "tenure.gateway.openapi._JOB_ID": CONSTANT,
    "tenure.kernel.registry.Tenure._agents": CONSTANT,  # filled by decorators at import, read afterwards
    "tenure.kernel.registry.Tenure._warmups": CONSTANT,  # filled by @app.warmup at import, read afterwards
    "tenure.settings._TABLE": CONSTANT,
    "tenure.settings._ALSO": CONSTANT,
    "tenure._LAZY": CONSTANT,  # the lazily loaded client side: name -> module
    "tenure.worker.claiming.OneStepClaimer._agents": CONSTANT,
    "tenure.worker.claiming.ReadyIndexHints._agents": CONSTANT,
    "tenure.worker.claiming.WorkerQuotaGate._by_key": CONSTANT,
    "tenure.worker.claiming.WorkerQuotaGate._plain": CONSTANT,
    "tenure.worker.observe.WorkerObserver._unwatch": CONSTANT,  # unwatch callbacks, run once at close
    # -- scoped to one call, request, stream or execution
    "tenure.control.quota_blocks.ExecutionQuotas.blocks": SCOPED,  # one execution's quota blocks
    "tenure.demos.examples._http": SCOPED,  # the example app's own HTTP client (not the runtime's)
    "tenure.gateway.problems.Problem.headers": SCOPED,  # one response
    "tenure.gateway.streams.Subscription._pending": SCOPED,  # one client stream
    "tenure.gateway.family.ChildEvents.cursors": SCOPED,  # one client stream (?include=children)
    "tenure.worker.waits.ExecutionWaits.commands": SCOPED,  # one execution
    "tenure.worker.execution.Execution.usage": SCOPED,  # one execution, written with its finish
}


def _mutable(node: ast.expr) -> bool:
    if isinstance(node, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in _MUTABLE_CALLS
    return False


def _assigned(node: ast.AST) -> tuple[list[ast.expr], ast.expr] | None:
    if isinstance(node, ast.Assign):
        return node.targets, node.value
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [node.target], node.value
    return None


def mutable_state(root: Path = SRC) -> set[str]:
    """Every module-level or `self.` mutable container of the package at `root`, as `module.name` or
    `module.Class.attr`."""
    found: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            got = _assigned(node)
            if got is not None and _mutable(got[1]):
                found |= {f"{module}.{t.id}" for t in got[0] if isinstance(t, ast.Name) and t.id != "__all__"}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                got = _assigned(node)
                if got is None or not _mutable(got[1]):
                    continue
                for t in got[0]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        found.add(f"{module}.{cls.name}.{t.attr}")
    return found


def test_every_mutable_in_process_state_is_in_the_inventory_or_allowed_by_name() -> None:
    unlisted = sorted(mutable_state() - ALLOWED.keys())
    assert not unlisted, (
        "in-process mutable state without a row in docs/state-inventory.md (add a row, then list it in "
        f"ALLOWED as ROW; or, if it is a constant or scoped to one call, say so in ALLOWED): {unlisted}"
    )


def test_the_inventory_names_every_state_listed_as_a_row_and_no_entry_is_stale() -> None:
    doc = DOC.read_text(encoding="utf-8")
    missing = sorted(k for k, v in ALLOWED.items() if v == ROW and k.rsplit(".", 1)[1] not in doc)
    assert not missing, f"listed as rows but not named in docs/state-inventory.md: {missing}"
    stale = sorted(ALLOWED.keys() - mutable_state())
    assert not stale, f"ALLOWED names state that no longer exists (remove it, and its row): {stale}"


def test_the_scan_finds_a_new_cache_of_a_module_or_an_object(tmp_path: Path) -> None:
    """The guard can fail: a module-level dict, or a set an object keeps, is found."""
    package = tmp_path / "tenure"
    package.mkdir()
    (package / "probe.py").write_text(
        "_cache = {}\n\nclass Hub:\n    def __init__(self) -> None:\n        self._seen: set[str] = set()\n",
        encoding="utf-8",
    )
    assert mutable_state(package) == {"tenure.probe._cache", "tenure.probe.Hub._seen"}
