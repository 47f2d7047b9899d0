// Tenure's dashboard: the live parts, in plain JavaScript (no build step, no CDN).
"use strict";

const csrf = () => document.querySelector('meta[name="csrf"]')?.content || "";

async function call(method, url, body) {
  const init = { method, credentials: "same-origin", headers: { "X-Tenure-CSRF": csrf() } };
  if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const r = await fetch(url, init);
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  return { status: r.status, ok: r.ok, data };
}

function say(el, text) { if (el) el.textContent = text; }

// -- the live jobs list: its rows and counts, re-rendered every second (paused on request or while focused) --
function liveJobs() {
  const table = document.getElementById("jobs");
  if (!table || !table.dataset.live) return;
  const toggle = document.getElementById("live-toggle");
  const status = document.getElementById("live-status");
  let paused = false, busy = false;
  toggle?.addEventListener("click", () => {
    paused = !paused;
    toggle.setAttribute("aria-pressed", String(paused));
    toggle.textContent = paused ? "Resume live updates" : "Pause live updates";
    say(status, paused ? "Paused." : "Live.");
  });
  const tick = async () => {
    if (paused || busy || document.hidden || table.contains(document.activeElement)) return;
    busy = true;
    try {
      const r = await fetch(table.dataset.live, { credentials: "same-origin" });
      if (r.ok) {
        const d = await r.json();
        table.tBodies[0].innerHTML = d.rows;
        document.getElementById("counts").innerHTML = d.counts;
        table.dataset.newest = d.newest || "";
      }
    } catch (e) { /* the next tick tries again */ } finally { busy = false; }
  };
  setInterval(tick, 1000);
}

// -- pages that refresh a part of themselves (workers, quotas) --
function refreshing() {
  const live = document.getElementById("live");
  if (!live || !live.dataset.refresh) return;
  setInterval(async () => {
    if (document.hidden || live.contains(document.activeElement)) return;
    try {
      const r = await fetch(location.href, { credentials: "same-origin" });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (fresh) live.innerHTML = fresh.innerHTML;
    } catch (e) { /* next time */ }
  }, Number(live.dataset.refresh));
}

// -- one job: its event stream (resumed by cursor), its summary, its buttons --
function jobPage() {
  const section = document.getElementById("job");
  if (!section) return;
  const id = section.dataset.job;
  const list = document.getElementById("events");
  const cursorEl = document.getElementById("cursor");
  const status = document.getElementById("stream-status");
  const outcome = document.getElementById("outcome");
  let cursor = section.dataset.cursor || "";
  let refreshTimer = null;

  const refresh = () => {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(async () => {
      const r = await fetch(`/ui/jobs/${id}/summary`, { credentials: "same-origin" });
      if (!r.ok) return;
      const d = await r.json();
      document.getElementById("summary").innerHTML = d.html;
      const terminal = ["succeeded", "failed", "cancelled", "lost", "expired", "dead"].includes(d.state);
      section.querySelector('[data-action="cancel"]').hidden = terminal;
      section.querySelector('[data-when="waiting"]').hidden = d.state !== "waiting";
      section.querySelector('[data-when="live"]').hidden = terminal;
      section.querySelector('[data-action="requeue"]').hidden = !terminal || d.state === "succeeded";
      if (editSection) editSection.hidden = !terminal || d.state === "succeeded";
      if (inputEl) inputEl.textContent = d.input;
      if (editArea && !editDirty && document.activeElement !== editArea) editArea.value = d.input;
      if (!terminal && !streaming) stream();
      refreshAudit();
    }, 150);
  };

  // -- the audit timeline: re-rendered after the stream delivers an event (the page of records shown stays the
  // same; opened disclosures stay open; never while focus is inside it: then when focus leaves) --
  const audit = document.getElementById("audit");
  let auditPending = false, auditLast = 0, auditTimer = null;
  const refreshAudit = async () => {
    if (!audit) return;
    if (audit.contains(document.activeElement)) { auditPending = true; return; }
    const wait = auditLast + 1000 - Date.now();  // at most one re-render a second, the last event included
    if (wait > 0) { clearTimeout(auditTimer); auditTimer = setTimeout(refreshAudit, wait); return; }
    auditLast = Date.now();
    auditPending = false;
    const q = audit.dataset.query;
    const r = await fetch(`/ui/jobs/${id}/audit` + (q ? `?${q}` : ""), { credentials: "same-origin" });
    if (!r.ok) return;
    const d = await r.json();
    const open = new Set([...audit.querySelectorAll("details[open]")].map((x) => x.dataset.key));
    audit.innerHTML = d.html;
    audit.querySelectorAll("details").forEach((x) => { if (open.has(x.dataset.key)) x.open = true; });
  };
  audit?.addEventListener("focusout", (ev) => {
    if (auditPending && !audit.contains(ev.relatedTarget)) refreshAudit();
  });

  // -- requeue with an edited input: the textarea's text is sent as it is; the gateway parses and checks it --
  const editSection = document.getElementById("requeue-edit");
  const editForm = document.getElementById("requeue-form");
  const editArea = document.getElementById("requeue-input");
  const editMsg = document.getElementById("requeue-message");
  const inputEl = document.getElementById("job-input");
  let editDirty = false;
  editArea?.addEventListener("input", () => { editDirty = true; });
  editForm?.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const btn = editForm.querySelector('button[type="submit"]');
    btn.disabled = true;
    say(editMsg, "Requeueing…");
    try {
      const r = await call("POST", `/ui/api/jobs/${id}/requeue`, { input: editArea.value });
      if (r.ok) {
        editDirty = false;
        editArea.removeAttribute("aria-invalid");
        say(editMsg, `✓ requeued with the edited input: ${r.data.state} again, epoch ${r.data.epoch}`);
        say(outcome, "requeue: requeued (input edited)");
        if (!streaming) stream();
        refresh();
      } else {
        if (r.data?.field === "input") editArea.setAttribute("aria-invalid", "true");
        say(editMsg, "✗ " + (r.data?.detail || `failed (${r.status})`));
      }
    } catch (e) {
      say(editMsg, "The gateway did not answer; nothing may have been requeued. Reload the page to see.");
    } finally { btn.disabled = false; }
  });

  const add = (e) => {
    const li = document.createElement("li");
    li.dataset.id = e.id;
    const code = document.createElement("code"); code.textContent = e.id;
    const b = document.createElement("b"); b.textContent = " " + e.type + " ";
    const p = document.createElement("span"); p.className = "payload";
    p.textContent = JSON.stringify(e.payload).slice(0, 300);
    li.append(code, b, p);
    list.append(li);
    list.scrollTop = list.scrollHeight;
    cursor = e.id;
    say(cursorEl, cursor);
  };

  // A fetch-based SSE reader: every event type is seen (EventSource needs a listener per type), and each
  // reconnect asks for exactly what follows the last event received: ?after=<cursor>.
  let streaming = false;
  const stream = async () => {
    streaming = true;
    say(status, "(live)");
    while (true) {
      let r;
      try {
        r = await fetch(`/v1/jobs/${id}/events` + (cursor ? `?after=${cursor}` : ""), { credentials: "same-origin", headers: { Accept: "text/event-stream" } });
      } catch (e) { await new Promise((ok) => setTimeout(ok, 1000)); continue; }
      if (r.status === 204) break;  // finished, nothing after the cursor
      if (!r.ok) { say(status, `(stream answered ${r.status})`); break; }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
          if (data) { add(JSON.parse(data)); refresh(); }
        }
      }
      await new Promise((ok) => setTimeout(ok, 300));  // closed after the terminal event: the next request is 204
    }
    streaming = false;
    say(status, "(complete)");
    refresh();
  };

  section.addEventListener("click", async (ev) => {
    const btn = ev.target.closest("button[data-action]");
    if (!btn) return;
    const act = btn.dataset.action;
    btn.disabled = true;
    try {
      let r;
      if (act === "cancel") {
        say(outcome, "Cancelling…");
        r = await call("POST", `/v1/jobs/${id}/cancel?wait=10`);
        if (r.data?.outcome) say(outcome, `cancel: ${r.data.outcome}` + ({ accepted: " — the job is cancelled", requested: " — persisted; the owner will act on it", already_finished: " — the job had finished" }[r.data.outcome] || ""));
      } else if (act === "approve" || act === "reject") {
        r = await call("POST", `/v1/jobs/${id}/approve`, { approved: act === "approve", comment: document.getElementById("comment").value || null });
        if (r.ok) say(outcome, `${act}: ${r.data.outcome}`);
      } else if (act === "input") {
        let value;
        try { value = JSON.parse(document.getElementById("input").value); } catch (e) { say(outcome, "The input is not JSON."); return; }
        r = await call("POST", `/v1/jobs/${id}/input`, { input: value });
        if (r.ok) say(outcome, `input: ${r.data.outcome}`);
      } else if (act === "requeue") {
        r = await call("POST", "/ui/api/requeue", { job_ids: [id] });
        const res = r.data?.results?.[0];
        if (res) say(outcome, `requeue: ${res.outcome}${res.detail ? " — " + res.detail : ""}`);
        if (res?.outcome === "requeued" && !streaming) stream();
      }
      if (r && !r.ok && !outcome.textContent.includes(":")) say(outcome, r.data?.detail || `failed (${r.status})`);
      else if (r && !r.ok) say(outcome, r.data?.detail || `failed (${r.status})`);
      refresh();
    } finally { btn.disabled = false; }
  });

  if (section.dataset.terminal !== "yes") stream();
  else fetch(`/v1/jobs/${id}/events` + (cursor ? `?after=${cursor}` : ""), { credentials: "same-origin" })
    .then((r) => { if (r.status !== 204) { r.body?.cancel(); stream(); } });  // requeued since the page was rendered
}

// -- dead letters: requeue one or many --
function deadPage() {
  const form = document.getElementById("dead");
  if (!form) return;
  const outcome = document.getElementById("outcome");
  document.getElementById("all")?.addEventListener("change", (e) => {
    form.querySelectorAll('input[name="job"]').forEach((c) => { c.checked = e.target.checked; });
  });
  const requeue = async (ids) => {
    if (!ids.length) { say(outcome, "Select jobs first."); return; }
    const r = await call("POST", "/ui/api/requeue", { job_ids: ids });
    if (!r.ok) { say(outcome, r.data?.detail || `failed (${r.status})`); return; }
    const done = r.data.results.filter((x) => x.outcome === "requeued").length;
    say(outcome, `requeued ${done} of ${ids.length}` + (done < ids.length ? ": " + r.data.results.filter((x) => x.outcome !== "requeued").map((x) => `${x.job_id.slice(0, 8)} ${x.outcome}`).join(", ") : ""));
    for (const x of r.data.results) if (x.outcome === "requeued") form.querySelector(`tr[data-job="${x.job_id}"]`)?.remove();
  };
  form.addEventListener("click", (ev) => {
    const btn = ev.target.closest("button[data-action]");
    if (!btn) return;
    if (btn.dataset.action === "requeue-one") requeue([btn.dataset.job]);
    else requeue([...form.querySelectorAll('input[name="job"]:checked')].map((c) => c.value));
  });
}

// -- the workers page: an admin's Drain button (delegated: the live part is re-rendered every 2 s) --
function workersPage() {
  const live = document.getElementById("live");
  const outcome = document.getElementById("drain-outcome");
  if (!live || !outcome) return;
  live.addEventListener("click", async (ev) => {
    const button = ev.target.closest('[data-action="drain"]');
    if (!button) return;
    const id = button.dataset.worker;
    if (!confirm(`Drain ${id}? It claims nothing new, finishes what it holds, then exits.`)) return;
    button.disabled = true;
    try {
      const r = await call("POST", `/ui/api/workers/${encodeURIComponent(id)}/drain`);
      say(outcome, r.ok ? `✓ ${id}: ${r.data.state}` : `${id}: ${(r.data && r.data.detail) || r.status}`);
    } catch (e) {
      say(outcome, `${id}: the gateway did not answer; reload the page to see whether it drains.`);
    } finally { button.disabled = false; }
  });
}

document.addEventListener("DOMContentLoaded", () => { liveJobs(); refreshing(); jobPage(); deadPage(); workersPage(); });
