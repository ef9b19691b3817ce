// poirotd's page: draws the daemon's JSON with DOM calls only. Every value may be agent-written,
// so each one enters the page as a text node or an attribute value, never as markup.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";

  // ---------------------------------------------------------------- DOM helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function sv(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function append(node, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
  }

  function fill(id, ...children) {
    const node = document.getElementById(id);
    node.replaceChildren();
    append(node, children);
    return node;
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    const pad = (n, w = 2) => String(n).padStart(w, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function clock(iso) {
    return when(iso).slice(11);
  }

  function pill(text, cls) {
    return el("span", { class: `pill ${cls}`, text });
  }

  function fixed(x, digits = 3) {
    return Number(x).toFixed(digits);
  }

  // ---------------------------------------------------------------- the API

  async function api(path, options) {
    const response = await fetch(path, { credentials: "same-origin", ...(options || {}) });
    if (response.status === 401) {
      location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
      throw new Error("sign-in needed");
    }
    if (!response.ok) throw new Error((await response.text()).trim() || response.statusText);
    return response.json();
  }

  function status(text) {
    fill("status", text || "");
  }

  function header(data) {
    const viewer = data.viewer;
    const system = data.system || (data.investigation && data.investigation.system) || "";
    fill("system", system);
    fill("who", viewer.name + (viewer.exchanges ? " · auditor" : "") + (viewer.confirm ? " · operator" : ""));
    document.getElementById("logout").hidden = !viewer.signed_in;
  }

  function follow(after, investigationId, onEvent) {
    const live = document.getElementById("live");
    const query = new URLSearchParams({ after: String(after) });
    if (investigationId) query.set("investigation", investigationId);
    const source = new EventSource("/api/events?" + query.toString());
    source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
    source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.className = "live off"; });
    source.addEventListener("investigation", (message) => onEvent(JSON.parse(message.data)));
    return source;
  }

  function debounce(fn, ms) {
    let timer = null;
    return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
  }

  // ---------------------------------------------------------------- the list

  async function listPage() {
    const form = document.getElementById("filters");
    const params = new URLSearchParams(location.search);
    for (const name of ["state", "method", "session", "component"]) {
      if (params.has(name)) form.elements[name].value = params.get(name);
    }
    let source = null;
    const load = async () => {
      const data = await api("/api/investigations?" + params.toString());
      header(data);
      drawRows(data.investigations);
      const more = document.getElementById("more");
      more.hidden = !data.next_page_token;
      if (data.next_page_token) {
        const next = new URLSearchParams(params);
        next.set("page_token", data.next_page_token);
        more.href = "/investigations?" + next.toString();
      }
      status(data.investigations.length ? "" : "No investigation matches.");
      return data;
    };
    try {
      const data = await load();
      source = follow(data.last_event_id, null, debounce(() => load().catch((e) => status(e.message)), 300));
    } catch (error) {
      status(error.message);
    }
    window.addEventListener("beforeunload", () => source && source.close());
  }

  function drawRows(rows) {
    fill("rows", rows.map((row) => el("tr", {},
      el("td", { class: "mono nowrap" }, when(row.created_at)),
      el("td", { class: "id" }, el("a", { href: "/investigations/" + encodeURIComponent(row.investigation_id), title: row.investigation_id, "aria-label": `investigation ${row.investigation_id}`, text: truncate(row.investigation_id, 13) })),
      el("td", { class: "mono nowrap", text: row.session_id }),
      el("td", {}, row.rule ? [pill(row.severity, "sev-" + row.severity), " ", row.rule] : el("span", { class: "note", text: row.reason })),
      el("td", { text: row.method }),
      el("td", {}, pill(row.state, "state-" + row.state), row.degraded ? " degraded" : ""),
      el("td", {}, row.top.map((r) => el("span", { class: "tag", text: r })), row.tie ? "(tie)" : ""),
      el("td", {}, row.confirmed.map((r) => el("span", { class: "tag", text: r }))),
    )));
  }

  // ---------------------------------------------------------------- one investigation

  async function investigationPage() {
    const id = decodeURIComponent(location.pathname.split("/").pop());
    fill("crumb", id);
    let drawnConfirm = false;
    let source = null;
    const load = async () => {
      const data = await api("/api/investigations/" + encodeURIComponent(id));
      header(data);
      drawInvestigation(data);
      if (!drawnConfirm && data.viewer.confirm && data.investigation.state === "succeeded") {
        drawConfirm(data, load);
        drawnConfirm = true;
      }
      return data;
    };
    try {
      const data = await load();
      const reload = debounce(() => load().catch((e) => status(e.message)), 250);
      source = follow(data.last_event_id, id, (event) => {
        if (event.vote) addVote(event.vote);
        reload();
      });
    } catch (error) {
      status(error.message);
    }
    window.addEventListener("beforeunload", () => source && source.close());
  }

  function drawInvestigation(data) {
    const inv = data.investigation;
    document.title = `${inv.investigation_id} · poirotd`;
    fill("title", `Investigation ${inv.investigation_id}`);
    status(inv.state === "running" || inv.state === "queued" ? "This investigation is under way: it updates as events arrive." : "");
    drawOverview(data);
    drawAttribution(data);
    drawProjection(data);
    drawTelemetry(data.telemetry);
    drawVotes(data);
    drawFindings(data);
    drawThreads(data.threads);
    drawTimeline(data.timeline, data.viewer);
  }

  function fact(label, ...value) {
    return el("div", {}, el("dt", { text: label }), el("dd", {}, ...value));
  }

  function drawOverview(data) {
    const inv = data.investigation;
    const facts = [
      fact("State", pill(inv.state, "state-" + inv.state), inv.degraded_reason ? " degraded" : ""),
      fact("Method", inv.method),
      fact("Session", el("span", { class: "mono", text: inv.session_id })),
      fact("Opened", when(inv.created_at)),
      fact("Finished", inv.finished_at ? when(inv.finished_at) : "—"),
      fact("LLM calls", `${inv.usage.calls} (${inv.usage.prompt_tokens + inv.usage.completion_tokens} tokens)`),
    ];
    if (data.trigger) {
      facts.push(fact("Trigger", pill(data.trigger.severity, "sev-" + data.trigger.severity), " ", data.trigger.rule));
      facts.push(el("div", { class: "wide" }, el("dt", { text: "Hazard" }), el("dd", { text: data.trigger.summary })));
    } else {
      facts.push(el("div", { class: "wide" }, el("dt", { text: "Reason" }), el("dd", { text: inv.reason })));
    }
    if (inv.degraded_reason) facts.push(el("div", { class: "wide" }, el("dt", { text: "Degraded" }), el("dd", { text: inv.degraded_reason })));
    if (inv.error) facts.push(el("div", { class: "wide" }, el("dt", { text: "Error" }), el("dd", { class: "error", text: inv.error })));
    if (inv.injection_findings.length) facts.push(el("div", { class: "wide" }, el("dt", { text: "Injection signs" }), el("dd", { text: inv.injection_findings.join("; ") })));
    if (data.confirmed) {
      facts.push(el("div", { class: "wide" }, el("dt", { text: "Confirmed outcome" }),
        el("dd", {}, data.confirmed.region_ids.map((r) => el("span", { class: "tag", text: r })),
          data.confirmed.note ? ` — ${data.confirmed.note}` : "", ` (${when(data.confirmed.at)})`)));
    }
    fill("overview", el("dl", { class: "facts" }, facts));
  }

  function regionLabel(region) {
    return region.name && region.name !== region.id ? `${region.name} (${region.id})` : region.id;
  }

  function drawAttribution(data) {
    const a = data.attribution;
    if (!a || !data.regions.length) {
      fill("attribution", el("p", { class: "note", text: "No attribution yet." }));
      return;
    }
    const confirmed = new Set(data.confirmed ? data.confirmed.region_ids : []);
    const rowH = 26, labelW = 230, barW = 280, width = labelW + barW + 120;
    const max = Math.max(...a.scores, 1e-9);
    const chart = sv("svg", { class: "chart", viewBox: `0 0 ${width} ${data.regions.length * rowH + 10}`, role: "img", "aria-label": "Score of each hazard region" });
    data.regions.forEach((region, i) => {
      const y = i * rowH + 4;
      const top = a.top.includes(i);
      const w = Math.max(1, (a.scores[i] / max) * barW);
      chart.appendChild(sv("text", { x: labelW - 8, y: y + 15, "text-anchor": "end", class: "label", text: truncate(region.name || region.id, 30) },
        sv("title", { text: `${regionLabel(region)}: ${region.description}` })));
      chart.appendChild(sv("rect", { x: labelW, y, width: w, height: rowH - 8, rx: 3, class: `bar${top ? " top" : ""}${confirmed.has(region.id) ? " confirmed" : ""}` }));
      chart.appendChild(sv("text", { x: labelW + w + 6, y: y + 14, text: fixed(a.scores[i]) + (confirmed.has(region.id) ? "  ✓ confirmed" : "") }));
    });
    const top = a.top.map((i) => data.regions[i].id).join(", ");
    fill("attribution", chart,
      el("p", { class: "note" }, `Top: ${top}${a.tie ? " (tie, not broken)" : ""} · rule ${a.rule} · β ${fixed(a.beta, 2)}`,
        a.step !== null && a.step !== undefined ? ` · fault first shows at message #${a.step}` : ""));
  }

  function truncate(text, n) {
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  function drawProjection(data) {
    const p = data.projection;
    if (!p || !p.anchors.length) {
      fill("projection", el("p", { class: "note", text: "No hazard space yet." }));
      return;
    }
    const width = 480, height = 340, c = width / 2, m = height / 2, scale = 250;  // radius 0.5 -> 125 px
    const X = (x) => c + x * scale, Y = (y) => m - y * scale;
    const chart = sv("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "Radial projection of the votes and the consensus" });
    chart.appendChild(sv("circle", { cx: c, cy: m, r: 0.5 * scale, class: "ring" }));
    chart.appendChild(sv("circle", { cx: c, cy: m, r: 0.25 * scale, class: "ring" }));
    chart.appendChild(sv("circle", { cx: c, cy: m, r: 2, class: "anchor" }));
    p.anchors.forEach(([x, y], i) => {
      chart.appendChild(sv("circle", { cx: X(x), cy: Y(y), r: 3, class: "anchor" }));
      const lx = X(x * 1.14), ly = Y(y * 1.14) + 4 + (y < -0.45 ? 6 : 0);
      const anchor = Math.abs(x) < 0.05 ? "middle" : x > 0 ? "start" : "end";
      chart.appendChild(sv("text", { x: lx, y: ly, "text-anchor": anchor, text: truncate(data.regions[i].id, 16) },
        sv("title", { text: regionLabel(data.regions[i]) })));
    });
    const groups = new Map();
    for (const v of p.votes) {
      const key = `${v.x.toFixed(4)},${v.y.toFixed(4)}`;
      if (!groups.has(key)) groups.set(key, { x: v.x, y: v.y, agents: [] });
      groups.get(key).agents.push(v.agent_id);
    }
    if (p.consensus) {
      const [x, y] = [X(p.consensus[0]), Y(p.consensus[1])], d = 15;
      chart.appendChild(sv("polygon", { points: `${x},${y - d} ${x + d},${y} ${x},${y + d} ${x - d},${y}`, class: "consensus" },
        sv("title", { text: "consensus (the decision vector)" })));
    }
    for (const g of groups.values()) {
      chart.appendChild(sv("circle", { cx: X(g.x), cy: Y(g.y), r: 5 + 2 * (g.agents.length - 1), class: "vote" },
        sv("title", { text: `vote: ${g.agents.join(", ")}` })));
      const inside = Math.hypot(g.x, g.y) < 0.45;
      if (inside) chart.appendChild(sv("text", { x: X(g.x) + 9, y: Y(g.y) + 4, class: "label", text: truncate(g.agents.join(", "), 30) }));
    }
    if (p.confirmed) chart.appendChild(star(X(p.confirmed[0]), Y(p.confirmed[1]), 10));
    const onCircle = [...groups.values()].filter((g) => Math.hypot(g.x, g.y) >= 0.45);
    fill("projection", chart,
      el("div", { class: "legend" },
        el("span", {}, el("span", { class: "swatch vote" }), "agent votes (larger: more agents)"),
        el("span", {}, el("span", { class: "swatch consensus" }), "consensus"),
        p.confirmed ? el("span", {}, el("span", { class: "swatch truth" }), "confirmed outcome") : null),
      onCircle.length ? el("p", { class: "note", text: onCircle.map((g) => `${g.agents.join(", ")}: ${nearest(p.anchors, g, data.regions)}`).join(" · ") }) : null,
      el("p", { class: "note", text: "Each region sits on the circle (the paper's Fig. 5); a vote for several regions lands between them, no fault at the centre." }));
  }

  function nearest(anchors, g, regions) {
    let best = 0;
    anchors.forEach(([x, y], i) => {
      if (Math.hypot(x - g.x, y - g.y) < Math.hypot(anchors[best][0] - g.x, anchors[best][1] - g.y)) best = i;
    });
    return regions[best].id;
  }

  function ticks(lo, hi, count) {
    const step0 = (hi - lo) / count;
    const magnitude = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 2.5, 5, 10].map((f) => f * magnitude).find((s) => s >= step0);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }

  function star(x, y, r) {
    const points = [];
    for (let i = 0; i < 10; i++) {
      const radius = i % 2 ? r * 0.45 : r;
      const angle = -Math.PI / 2 + (i * Math.PI) / 5;
      points.push(`${(x + radius * Math.cos(angle)).toFixed(1)},${(y + radius * Math.sin(angle)).toFixed(1)}`);
    }
    return sv("polygon", { points: points.join(" "), class: "truth" }, sv("title", { text: "confirmed outcome" }));
  }

  function drawTelemetry(t) {
    if (!t) {
      fill("telemetry", el("p", { class: "note", text: "No telemetry rule opened this investigation." }));
      return;
    }
    const width = 900, height = 250, left = 56, right = 34, top = 14, bottom = 34;
    const samples = t.samples.map(([at, v]) => [Date.parse(at), v]);
    const since = Date.parse(t.since), until = Date.parse(t.until), fired = Date.parse(t.fired_at);
    const values = samples.map((s) => s[1]).concat(t.levels.map((l) => l.value));
    if (!values.length) {
      fill("telemetry", el("p", { class: "note", text: "No samples stored in the window." }));
      return;
    }
    let lo = Math.min(...values), hi = Math.max(...values);
    if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
    const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
    const X = (ms) => left + ((ms - since) / Math.max(until - since, 1)) * (width - left - right);
    const Y = (v) => top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom);
    const chart = sv("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${t.component}.${t.signal} around the hazard` });
    for (const v of ticks(lo, hi, 5)) {
      chart.appendChild(sv("line", { x1: left, x2: width - right, y1: Y(v), y2: Y(v), class: "grid-line" }));
      chart.appendChild(sv("text", { x: left - 6, y: Y(v) + 4, "text-anchor": "end", text: v }));
    }
    for (let i = 0; i <= 5; i++) {
      const ms = since + ((until - since) * i) / 5;
      chart.appendChild(sv("text", { x: X(ms), y: height - 12, "text-anchor": "middle", text: clock(new Date(ms).toISOString()) }));
    }
    chart.appendChild(sv("line", { x1: left, x2: left, y1: top, y2: height - bottom, class: "axis" }));
    chart.appendChild(sv("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom, class: "axis" }));
    for (const level of t.levels) {
      chart.appendChild(sv("line", { x1: left, x2: width - right, y1: Y(level.value), y2: Y(level.value), class: "level" }));
      chart.appendChild(sv("text", { x: width - right - 4, y: Y(level.value) - 5, "text-anchor": "end", class: "level-text", text: `${level.label} ${level.value}` }));
    }
    const shown = samples.filter(([ms]) => ms >= since && ms <= until);
    if (shown.length) {
      chart.appendChild(sv("polyline", { points: shown.map(([ms, v]) => `${X(ms).toFixed(1)},${Y(v).toFixed(1)}`).join(" "), class: "series" }));
    }
    for (const [at, v] of t.evidence) {
      const ms = Date.parse(at);
      if (ms >= since && ms <= until) chart.appendChild(sv("circle", { cx: X(ms), cy: Y(v), r: 3, class: "evidence" }, sv("title", { text: `evidence ${v} at ${clock(at)}` })));
    }
    chart.appendChild(sv("line", { x1: X(fired), x2: X(fired), y1: top, y2: height - bottom, class: "fired" }));
    const late = X(fired) > width * 0.6;
    chart.appendChild(sv("text", { x: X(fired) + (late ? -6 : 6), y: top + 10, "text-anchor": late ? "end" : "start", class: "fired-text", text: `${t.rule} fired ${clock(t.fired_at)}` }));
    const kind = t.kind ? `${t.kind} rule` : "rule";
    fill("telemetry", el("h3", { text: `${t.component}.${t.signal}` }), chart,
      el("p", { class: "note" }, `${shown.length} samples from ${when(t.since)} to ${clock(t.until)}; the ${kind} `, el("strong", { text: t.rule }),
        t.levels.length ? " and its levels (dashed)" : " (its limit is on a derived quantity: no fixed level to draw)",
        "; red points are the evidence the rule kept."));
  }

  function drawVotes(data) {
    const votes = data.votes;
    if (!votes.length) {
      fill("votes", el("p", { class: "note", text: "No vote yet." }));
      return;
    }
    fill("votes", el("div", { class: "votes", id: "vote-cards" }, votes.map((v) => voteCard(v, data.regions))));
  }

  function voteCard(v, regions) {
    const blamed = (v.location || []).map((bit, i) => (bit ? (regions[i] ? regions[i].id : `#${i}`) : null)).filter(Boolean);
    return el("article", { class: "vote-card", "data-agent": v.agent_id },
      el("h3", {}, el("span", { text: v.agent_id }), el("span", { class: "weight", text: v.abstention_reason ? "abstained" : `weight ${fixed(v.weight)}` })),
      v.abstention_reason
        ? el("p", { class: "note", text: v.abstention_reason })
        : el("p", {}, blamed.length ? blamed.map((r) => el("span", { class: "tag", text: r })) : el("span", { class: "note", text: "no anomaly (all zeros)" })),
      v.hazard_vector ? el("p", {}, el("strong", { text: v.hazard_vector })) : null,
      v.justification ? el("p", { class: "justification", text: v.justification }) : null,
      v.forced_by ? el("p", { class: "note", text: `forced: ${v.forced_by.replace("_", " ")}` }) : null,
      v.step !== null && v.step !== undefined ? el("p", { class: "note", text: `fault first shows at message #${v.step}` }) : null);
  }

  function addVote(vote) {
    let cards = document.getElementById("vote-cards");
    if (!cards) cards = fill("votes", el("div", { class: "votes", id: "vote-cards" })).firstChild;
    const card = voteCard(vote, []);
    card.classList.add("new");
    cards.appendChild(card);
  }

  function tree(value) {
    if (Array.isArray(value)) {
      if (!value.length) return el("span", { class: "note", text: "none" });
      return el("ol", { class: "tree" }, value.map((v) => el("li", {}, tree(v))));
    }
    if (value && typeof value === "object") {
      const entries = Object.entries(value);
      if (!entries.length) return el("span", { class: "note", text: "none" });
      return el("dl", { class: "tree" }, entries.map(([k, v]) => [el("dt", { text: k.replaceAll("_", " ") }), el("dd", {}, tree(v))]));
    }
    return document.createTextNode(value === null ? "—" : String(value));
  }

  // Each method's findings, its headline parts first: ECHO's consensus, ErrorProbe's verdict,
  // diagnosis and hypotheses with their checked evidence (claims, each passed or not); the rest
  // folded.
  const HEADLINES = {
    echo: { consensus: "consensus" },
    errorprobe: { verdict: "verdict", diagnosis: "diagnosis", hypotheses: "hypotheses and their checked evidence" },
    ensemble: { members: "members" },
  };

  function drawFindings(data) {
    const findings = data.findings || {};
    const method = findings.method || data.investigation.method;
    const parts = [];
    if (!Object.keys(findings).length) {
      const reports = Object.entries(data.reports || {});
      parts.push(el("p", { class: "note", text: `${method}: the votes are its findings; each agent's self-assessment (Phase II) follows.` }));
      for (const [agent, report] of reports) {
        parts.push(el("details", {}, el("summary", { text: `${agent}'s self-assessment` }), tree(report)));
      }
      fill("findings", parts);
      return;
    }
    const headline = HEADLINES[method] || {};
    for (const [key, title] of Object.entries(headline)) {
      if (key in findings) parts.push(el("h3", { text: title }), tree(findings[key]));
    }
    for (const [key, value] of Object.entries(findings)) {
      if (key === "method" || key in headline) continue;
      parts.push(el("details", {}, el("summary", { text: key.replaceAll("_", " ") }), tree(value)));
    }
    fill("findings", el("p", { class: "note", text: `Method: ${method}` }), parts);
  }

  function drawThreads(threads) {
    const card = document.getElementById("threads-card");
    card.hidden = threads === null;
    if (threads === null) return;
    if (!threads.length) {
      fill("threads", el("p", { class: "note", text: "No interrogation recorded yet." }));
      return;
    }
    fill("threads", threads.map((thread) => el("div", { class: "thread" },
      el("h3", { text: thread.agent_id }),
      thread.turns.map((turn) => el("div", { class: "turn" },
        el("div", { class: "note", text: `${clock(turn.at)} · ${turn.phase} · ${turn.purpose} · ${turn.seconds} s` }),
        turn.error ? el("p", { class: "error", text: turn.error }) : said(turn),
        el("details", {}, el("summary", { text: `prompt (its last ${turn.asked_role} message, of ${turn.prompt_messages})` }), el("pre", { text: turn.asked })),
        el("details", {}, el("summary", { text: "raw answer" }), el("pre", { text: turn.answer })))))));
  }

  // What an agent said in a turn, read from its answer's JSON when it is one (a question to a
  // peer, a vote); else the answer's text.
  function said(turn) {
    let answer = null;
    try { answer = JSON.parse(turn.answer); } catch (error) { answer = null; }
    if (answer && typeof answer === "object" && answer.question !== undefined) {
      return el("p", {}, el("strong", { text: `asks ${String(answer.peer || "").replace(/^talk_to_/, "")}: ` }), String(answer.question));
    }
    if (answer && typeof answer === "object" && answer.location !== undefined) {
      return el("p", {}, el("strong", { text: `votes ${JSON.stringify(answer.location)}: ` }), String(answer.hazard_vector || ""), " — ", String(answer.justification || ""));
    }
    if (turn.purpose === "answer") return el("p", {}, el("strong", { text: "answers: " }), turn.answer);
    return el("pre", { text: turn.answer });
  }

  const EVENT_TEXT = {
    started: () => "investigation started",
    phase_begun: (e) => `phase ${e.phase} begun`,
    phase_ended: (e) => `phase ${e.phase} ended (${fixed(e.seconds || 0, 2)} s)`,
    vote_cast: (e) => `${e.vote.agent_id} voted`,
    attribution_ready: (e) => `attribution ready: ${(e.attribution.top || []).map((i) => e.region_ids[i]).join(", ")}`,
    failed: (e) => `failed: ${e.reason}`,
    interrupted: (e) => `interrupted: ${e.reason}`,
    waiting_for_model: (e) => `waiting for the model: ${e.reason}`,
    model_returned: () => "the model answers again",
    deferred: (e) => `deferred: ${e.reason}`,
  };

  function drawTimeline(items, viewer) {
    const list = el("ol", { class: "timeline" });
    for (const item of items) {
      const at = el("span", { class: "when", text: when(item.at) });
      if (item.kind === "hazard") {
        list.appendChild(el("li", { class: "hazard" }, at, " ", pill(item.severity, "sev-" + item.severity), " ", el("strong", { text: item.rule }), el("p", { class: "text", text: item.summary })));
      } else if (item.kind === "event") {
        const text = (EVENT_TEXT[item.event] || (() => item.event))(item);
        list.appendChild(el("li", { class: "event" }, at, " ", text));
      } else {
        const who = el("span", { class: "who", text: item.recipient ? `${item.sender} → ${item.recipient}` : item.sender });
        const body = [];
        if (item.text) body.push(longText(item.text));
        for (const call of item.tool_calls) body.push(el("p", { class: "text mono", text: `tool call: ${call}` }));
        list.appendChild(el("li", { class: item.kind }, at, ` #${item.index} `, who, item.tool_name ? ` (${item.tool_name})` : "", body));
      }
    }
    const note = viewer.exchanges ? null : el("p", { class: "note", text: "The session's messages and the interrogation are shown to auditors only." });
    fill("timeline", note, list);
  }

  function longText(text) {
    if (text.length <= 400) return el("p", { class: "text", text });
    return el("details", {}, el("summary", { text: text.slice(0, 160).replace(/\s+/g, " ") + "…" }), el("p", { class: "text", text }));
  }

  function drawConfirm(data, reload) {
    const card = document.getElementById("confirm-card");
    card.hidden = false;
    const a = data.attribution;
    const already = data.confirmed;
    const boxes = data.regions.map((region, i) => el("label", {},
      el("input", { type: "checkbox", name: "region", value: region.id, checked: already ? already.region_ids.includes(region.id) : a && a.top.includes(i) }),
      " ", regionLabel(region)));
    const note = el("textarea", { name: "note", "aria-label": "Note: who confirms, and how it was found" });
    const supersede = el("input", { type: "checkbox", name: "supersede" });
    const result = el("p", { class: "status", role: "status" });
    const form = el("form", { class: "confirm-form" },
      el("fieldset", {}, el("legend", { text: "True cause(s)" }), boxes),
      el("label", {}, "Note (who confirms, and how it was found)", note),
      already ? el("label", {}, supersede, " Supersede the confirmed outcome (a correction; needs a note)") : null,
      el("button", { type: "submit", text: already ? "Correct the outcome" : "Confirm the outcome" }),
      result);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const regions = Array.from(form.querySelectorAll("input[name=region]:checked")).map((box) => box.value);
      try {
        const answer = await api(`/api/investigations/${encodeURIComponent(data.investigation.investigation_id)}/confirm`, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ region_ids: regions, note: note.value, supersede: supersede.checked }),
        });
        result.textContent = answer.newly_confirmed ? "Confirmed." : "Already confirmed with these regions: unchanged.";
        await reload();
      } catch (error) {
        result.textContent = error.message;
      }
    });
    fill("confirm", el("p", { class: "note", text: "Records the true cause in the audit chain; with reputation on, every agent's β is derived anew." }), form);
  }

  // ---------------------------------------------------------------- start

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    if (page === "list") listPage();
    else if (page === "investigation") investigationPage();
  });
})();
