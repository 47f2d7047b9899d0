// The live labs: start one, follow its lines over SSE, draw its figure as inline SVG.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 260, L = 48, R = 12, T = 14, B = 30;

function el(name, attrs, text) {
  const n = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  if (text !== undefined) n.textContent = text;
  return n;
}

function axes(svg, xmax, ymax, ylabel, xlabel) {
  const g = el("g");
  for (let i = 0; i <= 4; i++) {
    const y = T + (H - T - B) * (1 - i / 4);
    g.append(el("line", { x1: L, x2: W - R, y1: y, y2: y, class: "grid" }));
    g.append(el("text", { x: 4, y: y + 4 }, (ymax * i / 4).toFixed(ymax < 10 ? 1 : 0)));
  }
  g.append(el("text", { x: L, y: H - 6 }, "0 s"));
  g.append(el("text", { x: W - R - 40, y: H - 6 }, `${xmax.toFixed(0)} s`));
  g.append(el("text", { x: L + 4, y: T + 10 }, ylabel));
  g.append(el("text", { x: W / 2 - 30, y: H - 6 }, xlabel || "time"));
  svg.append(g);
}

function line(svg, pts, xmax, ymax, cls, label) {
  if (!pts.length) return;
  const sx = (x) => L + (W - L - R) * (x / xmax), sy = (y) => T + (H - T - B) * (1 - Math.min(y, ymax) / ymax);
  svg.append(el("polyline", { points: pts.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "), class: cls, "data-series": label }));
}

function clear(svg) { [...svg.childNodes].forEach((c) => { if (c.nodeName !== "title") c.remove(); }); }

const draw = {
  loop(svg, s, legend) {
    const pts = s.samples;
    const xmax = Math.max(5, ...pts.map((p) => p.t));
    const ymax = Math.max(50, ...pts.map((p) => p.lag_ms)) * 1.1;
    clear(svg); axes(svg, xmax, ymax, "loop lag (ms)");
    for (const phase of ["loop", "thread"]) {
      line(svg, pts.filter((p) => p.phase === phase).map((p) => [p.t, p.lag_ms]), xmax, ymax, phase === "loop" ? "s2" : "s1", phase);
    }
    const late = pts.map((p) => [p.t, p.late_heartbeats]);
    const lmax = Math.max(1, ...pts.map((p) => p.late_heartbeats));
    line(svg, late.map(([t, n]) => [t, n * ymax / lmax / 1.2]), xmax, ymax, "s3", "late heartbeats");
    for (const m of s.marks) {
      const x = L + (W - L - R) * (m.t / xmax);
      svg.append(el("line", { x1: x, x2: x, y1: T, y2: H - B, class: "grid" }));
      svg.append(el("text", { x: x + 3, y: T + 24 }, m.label));
    }
    legend.textContent = `Dashed: loop lag with time.sleep on the loop. Solid: loop lag through ctx.to_thread. Dotted: late heartbeats (0 to ${lmax}, scaled).`;
  },
  lease(svg, s, legend) {
    const pts = s.samples;
    const limit = s.info.limit || 4;
    const xmax = Math.max(5, ...pts.map((p) => p.t));
    clear(svg); axes(svg, xmax, limit, "free slots");
    line(svg, pts.map((p) => [p.t, p.lease_free]), xmax, limit, "s1", "lease");
    line(svg, pts.map((p) => [p.t, p.counter_free]), xmax, limit, "s2", "counter");
    let last = 0;
    for (const p of pts) {
      if (p.crashes > last) {
        const x = L + (W - L - R) * (p.t / xmax);
        svg.append(el("text", { x: x - 3, y: H - B - 2, "data-crash": p.crashes }, "✕"));
        last = p.crashes;
      }
    }
    legend.textContent = "Solid: free slots of the lease-backed quota (measured in the store). Dashed: free slots a naive counter would report (simulated from the same jobs). ✕: a holder crashed.";
  },
  owner(svg, s, legend) {
    const jobs = s.jobs || [];
    const lanes = ["W1", "W2", "W3"];
    const xmax = Math.max(5, s.now);
    clear(svg);
    const defs = el("defs"), hatch = el("pattern", { id: "lab-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    hatch.append(el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#a40e26", "stroke-width": 2 }));
    defs.append(hatch);
    svg.append(defs);
    const lh = (H - T - B) / 3, sx = (t) => L + (W - L - R) * (Math.max(0, t) / xmax);
    lanes.forEach((w, i) => {
      svg.append(el("text", { x: 6, y: T + lh * i + lh / 2 + 4 }, w));
      svg.append(el("line", { x1: L, x2: W - R, y1: T + lh * (i + 1), y2: T + lh * (i + 1), class: "grid" }));
    });
    svg.append(el("text", { x: L, y: H - 6 }, "0 s"));
    svg.append(el("text", { x: W - R - 40, y: H - 6 }, `${xmax.toFixed(0)} s`));
    for (const j of jobs) {
      const bars = j.runs.map((r) => ({ w: r.worker, a: r.start, b: r.end ?? s.now, e: r.epoch, o: r.outcome }));
      if (j.state === "running" && j.owner && j.started != null) bars.push({ w: j.owner, a: j.started, b: s.now, e: j.epoch, o: "running" });
      for (const b of bars) {
        const i = lanes.indexOf(b.w);
        if (i < 0) continue;
        svg.append(el("rect", { x: sx(b.a), y: T + lh * i + 6, width: Math.max(2, sx(b.b) - sx(b.a)), height: lh - 12, class: b.o === "lost" ? "run-lost" : "run", "data-job": j.label, "data-epoch": b.e }));
        svg.append(el("text", { x: sx(b.a) + 2, y: T + lh * i + lh / 2 + 4 }, `${j.label} @${b.e}`));
      }
    }
    for (const f of s.frozen) {
      const i = lanes.indexOf(f.worker);
      svg.append(el("rect", { x: sx(f.a), y: T + lh * i + 6, width: Math.max(2, sx(f.b ?? s.now) - sx(f.a)), height: lh - 12, class: "frozen", "data-frozen": f.label }));
      svg.append(el("text", { x: sx(f.a) + 2, y: T + lh * i + 16 }, `${f.label} @${f.epoch}: claimed, frozen`));
    }
    legend.textContent = "Each bar is an execution on a worker (job @epoch). Hatched, dashed outline: a claim that was never started (its worker froze).";
  },
};

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("lab");
  if (!form) return;
  const name = form.dataset.lab;
  const svg = document.getElementById("figure");
  const legend = document.getElementById("legend");
  const status = document.getElementById("lab-status");
  const log = document.getElementById("lab-log");
  const result = document.getElementById("result");
  let source = null;
  let state = null;

  const note = (text) => { const li = document.createElement("li"); li.textContent = text; log.append(li); };

  const follow = () => {
    state = { samples: [], marks: [], info: {}, jobs: [], now: 0, frozen: [] };
    log.innerHTML = ""; result.textContent = "";
    source?.close();
    source = new EventSource(`/ui/api/labs/${name}/events`);
    source.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.kind === "info") { state.info = m; note(m.text); }
      else if (m.kind === "event") {
        note(`${m.t.toFixed(1)} s — ${m.text}`);
        if (name === "loop" && m.text.includes("jobs of")) state.marks.push({ t: m.t, label: m.phase === "loop" ? "on the loop" : "to_thread" });
      } else if (m.kind === "sample") {
        if (name === "owner") {
          state.jobs = m.jobs; state.now = m.t;
          const v = m.jobs.find((j) => j.label === "victim");
          if (v) {
            const open = state.frozen.find((f) => f.b == null);
            if (v.state === "queued" && v.owner === "W3" && !open) state.frozen.push({ worker: "W3", a: m.t, b: null, label: "victim", epoch: v.epoch });
            else if (open && (v.owner !== "W3" || v.state !== "queued")) open.b = m.t;
          }
        } else state.samples.push(m);
        draw[name](svg, state, legend);
      } else if (m.kind === "result") { result.textContent = m.text; say("finished"); }
      else if (m.kind === "error") { note(`error: ${m.text}`); say("failed: " + m.text); }
      else if (m.kind === "log") { note(m.text); }
      else if (m.kind === "end") { source.close(); if (!result.textContent) say(`ended (${m.returncode})`); else say("finished"); }
    };
    source.onerror = () => { if (source.readyState === 2) say(result.textContent ? "finished" : "stream closed"); };
  };
  const say = (t) => { status.textContent = t; };

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const params = {};
    for (const input of form.querySelectorAll("input[name]")) params[input.name] = Number(input.value);
    say("starting…");
    const r = await fetch(`/ui/api/labs/${name}`, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json", "X-Tenure-CSRF": document.querySelector('meta[name="csrf"]').content }, body: JSON.stringify(params) });
    const d = await r.json().catch(() => ({}));
    if (!r.ok) { say(d.detail || `refused (${r.status})`); return; }
    say("running…");
    follow();
  });
  document.getElementById("stop").addEventListener("click", async () => {
    await fetch(`/ui/api/labs/${name}/stop`, { method: "POST", credentials: "same-origin", headers: { "X-Tenure-CSRF": document.querySelector('meta[name="csrf"]').content } });
    say("stopped");
  });
});
