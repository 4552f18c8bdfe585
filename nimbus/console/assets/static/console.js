// The web console's script: live updates of the propagation matrix and of the flows
// page from the server's event streams, and the details of a cell on click. Plain
// JavaScript, no library.
"use strict";

// liveState shows whether the page's event stream is open.
function liveState(text, ok) {
  const el = document.getElementById("live");
  if (!el) return;
  el.textContent = text;
  el.classList.toggle("on", ok);
}

// updateRow applies one row of an update event to the matrix: each cell's phase (its
// class) and its title, and the row's summary.
function updateRow(table, r) {
  const tr = table.querySelector('tr[data-key="' + CSS.escape(r.id) + '"]');
  if (!tr) return;
  if (r.d) {
    tr.classList.add("deleted");
    tr.querySelector("td.sum").textContent = "deleted";
    return;
  }
  tr.classList.remove("deleted");
  tr.querySelector("td.sum").textContent = r.s;
  for (const c of r.c || []) {
    const td = tr.querySelector('td[data-node="' + CSS.escape(c.n) + '"]');
    if (!td) continue;
    const phase = c.p || "";
    if (td.dataset.phase !== phase) {
      td.className = "cell " + phase + " changed";
      td.dataset.phase = phase;
    }
    if (c.t) td.title = c.t; else td.removeAttribute("title");
  }
}

// showDetail shows what a clicked cell says under the matrix.
function showDetail(td) {
  const detail = document.getElementById("detail");
  const tr = td.closest("tr");
  detail.hidden = false;
  detail.className = "detail " + (td.dataset.phase || "");
  detail.textContent = "";
  const h = document.createElement("strong");
  h.textContent = tr.dataset.key;
  const p = document.createElement("p");
  p.textContent = td.title || (td.dataset.node + ": not a target");
  detail.append(h, p);
}

// matrixPage wires the matrix: clicks and the event stream.
function matrixPage() {
  const table = document.getElementById("matrix");
  if (!table) { liveState("nothing to follow", false); return; }
  table.addEventListener("click", (e) => {
    const td = e.target.closest("td.cell");
    if (td) showDetail(td);
  });
  const es = new EventSource(table.dataset.events);
  es.onopen = () => liveState("live", true);
  es.onerror = () => liveState("reconnecting…", false);
  es.addEventListener("update", (e) => {
    for (const r of JSON.parse(e.data)) updateRow(table, r);
  });
}

// flowsPage refreshes the table and graph when the event stream says records came,
// at most one fetch at a time.
function flowsPage() {
  const box = document.getElementById("flowtable");
  let busy = false, again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const resp = await fetch(box.dataset.table, { cache: "no-store" });
      if (resp.ok) box.innerHTML = await resp.text();
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }
  const es = new EventSource(box.dataset.events);
  es.onopen = () => liveState("live", true);
  es.onerror = () => liveState("reconnecting…", false);
  es.addEventListener("update", refresh);
}

document.addEventListener("DOMContentLoaded", () => {
  switch (document.body.dataset.page) {
    case "matrix": matrixPage(); break;
    case "flows": flowsPage(); break;
  }
});
