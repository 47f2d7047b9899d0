"""The demo's step 4b: a retry-safe agent whose effects are journaled (`ctx.step`) resumes after a SIGKILL.

The `journaled_steps` job appends `fetch`, then `publish` (and sleeps), then `notify` to a file, each line one
journaled step. Its worker is killed after the `publish` line is written and before the step's end is
recorded. Because the agent is `retry_safe`, the sweeper requeues the job instead of marking it `lost`; a new
worker runs the next attempt, which gets `fetch` from the journal without running it, is told that `publish`
began and never ended (`StepUnknown`), finds its line in the file and resolves it, and runs `notify`. The file
ends with each line exactly once (docs/journal.md).
"""

from __future__ import annotations

from tenure.contracts.states import JobState
from tenure.contracts.types import Event
from tenure.demos._stage import CLAIM_TTL_S, STEP_TIMEOUT_S, DemoFailure, Stage, Tracked, _events_line

PUBLISH_SLEEP_S = 60.0


async def step_journaled(demo: Stage, next_worker: int) -> Tracked:
    """Run step 4b with the workers alive now; spawns worker `next_worker` after the kill."""
    demo.section("4b. a retry-safe agent with a journal: requeued after SIGKILL, its done steps not run again")
    path = demo.workdir / "journal.txt"
    t = await demo.submit("journaled", "journaled_steps", {"path": str(path), "seconds": PUBLISH_SLEEP_S})
    demo.log(f"submitted {t.label}: journaled_steps (appends fetch, publish, notify to {path.name}; retry_safe)")

    async def publishing() -> list[Event] | None:
        events = await demo.events(t)
        begun = any(isinstance(e.payload, dict) and e.payload.get("begins") == "publish" for e in events)
        return events if begun and path.exists() and "publish" in path.read_text().split() else None

    events = await demo.until(f"{t.label} to be inside its publish step", publishing, STEP_TIMEOUT_S)
    started = next(e for e in events if e.type == "execution.started")
    worker_id = started.payload.get("worker_id") if isinstance(started.payload, dict) else None
    victim = next((w for w in demo.workers if w.worker_id == worker_id and not w.killed), None)
    if victim is None:
        raise DemoFailure(f"{t.label} runs on {worker_id}, which is not a live worker of this demo")
    demo.log(f"{t.label} on {victim.label}: fetch done, publish written to the file but its step not ended")
    await demo.kill(victim)
    demo.log(f"SIGKILL {victim.label} (pid {victim.pid}) inside the publish step")
    fresh = demo.spawn_worker(next_worker)
    await demo.wait_registered([fresh])

    job = await demo.until(f"{t.label} to finish", lambda: demo.terminal(t), CLAIM_TTL_S + 3 * STEP_TIMEOUT_S)
    lines = path.read_text().split()
    execs = await demo.executions(t)
    events = await demo.events(t)
    unknown = [e for e in events if e.type == "step.unknown"]
    demo.log(
        f"{t.label} {job.state.value} at epoch {job.epoch} after {job.attempts} attempts; executions: "
        + ", ".join(f"{demo.name(e.worker_id)} {e.outcome} @{e.epoch}" for e in execs)
    )
    demo.log(f"{path.name} = {' '.join(lines)}  (each step's effect once)")
    demo.say("The lost run was requeued (retry_safe), not marked lost. The next attempt took fetch from the")
    demo.say("journal without running it; publish had begun and never ended, so it was told (StepUnknown),")
    demo.say("found its line in the file and resolved the step instead of running it blind; then notify.")
    demo.say("events: " + _events_line(demo, events))
    t.note = f"{victim.label} killed in a step; resumed on {fresh.label}"
    if job.state is not JobState.SUCCEEDED or lines != ["fetch", "publish", "notify"] or len(unknown) != 1:
        raise DemoFailure(
            f"{t.label}: state {job.state.value}, file {lines}, {len(unknown)} StepUnknown; expected succeeded, "
            "fetch publish notify, and one StepUnknown"
        )
    return t
