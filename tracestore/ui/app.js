// The cacheblend trace viewer: the request index, one waterfall per trace with a lane per
// process, and where each request's time went. Plain JavaScript, no build step; every value
// from a trace is inserted as text, never as HTML.
'use strict';

const KNOWN_SERVICES = ['cb-engine', 'cb-worker', 'cb-blend'];
const SERVICE_COLORS = { 'cb-engine': '#2563eb', 'cb-worker': '#d97706', 'cb-blend': '#059669' };
const PALETTE = ['#7c3aed', '#db2777', '#0891b2', '#65a30d', '#dc2626', '#4b5563'];
const REFRESH_MS = 5000;

const state = { requests: [], timer: null, traceID: null, selected: null };

// ---------------------------------------------------------------- helpers

function $(sel) { return document.querySelector(sel); }

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'style') Object.assign(el.style, v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function colorOf(service) {
  if (SERVICE_COLORS[service]) return SERVICE_COLORS[service];
  let hash = 0;
  for (const ch of service) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
}

function serviceOrder(a, b) {
  const ia = KNOWN_SERVICES.indexOf(a), ib = KNOWN_SERVICES.indexOf(b);
  if (ia >= 0 || ib >= 0) return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
  return a < b ? -1 : a > b ? 1 : 0;
}

// fmtDur renders milliseconds with a precision that suits the magnitude.
function fmtDur(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  const a = Math.abs(ms);
  if (a < 1) return (ms * 1000).toFixed(0) + ' µs';
  if (a < 10) return ms.toFixed(2) + ' ms';
  if (a < 1000) return ms.toFixed(1) + ' ms';
  return (ms / 1000).toFixed(2) + ' s';
}

// msFixed renders nanoseconds as milliseconds with three decimals (the breakdown tables).
function msFixed(ns) { return (ns / 1e6).toFixed(3); }

function fmtPct(f) { return f === null || f === undefined ? '—' : (f * 100).toFixed(1) + ' %'; }

function fmtClock(us) {
  const d = new Date(us / 1000);
  const p = (n, w) => String(n).padStart(w, '0');
  return `${p(d.getHours(), 2)}:${p(d.getMinutes(), 2)}:${p(d.getSeconds(), 2)}.${p(d.getMilliseconds(), 3)}`;
}

function fmtDateTime(us) {
  const d = new Date(us / 1000);
  return d.toLocaleDateString() + ' ' + fmtClock(us);
}

// fill replaces an element's children, skipping null and flattening arrays.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function chip(service, instance) {
  return h('span', { class: 'chip' }, h('span', { class: 'dot', style: { background: colorOf(service) } }), service,
    instance ? h('span', { class: 'muted instance', text: '@' + instance }) : null);
}

// laneOrder sorts lanes (process instances) by service, then by their first span.
function laneOrder(lanes) {
  const first = new Map(lanes.map((l, i) => [l.name, i]));
  return lanes.slice().sort((a, b) => serviceOrder(a.service, b.service) || first.get(a.name) - first.get(b.name));
}

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: 'application/json' } });
  let body = null;
  try { body = await resp.json(); } catch (e) { /* reported below */ }
  if (!resp.ok || !body || (body.errors && body.errors.length)) {
    const msg = body && body.errors && body.errors.length ? body.errors[0].msg : resp.statusText;
    throw new Error(`${path}: ${resp.status} ${msg}`);
  }
  return body;
}

function showError(err) {
  const el = $('#error');
  if (!err) { el.hidden = true; el.textContent = ''; return; }
  el.hidden = false;
  el.textContent = String(err.message || err);
}

// ---------------------------------------------------------------- request list

async function loadList() {
  try {
    const [reqs, stats] = await Promise.all([api('/api/requests?limit=500'), api('/api/stats')]);
    state.requests = reqs.data || [];
    renderStats(stats.data, reqs.total);
    renderList();
    showError(null);
  } catch (err) {
    showError(err);
  }
}

function renderStats(st, total) {
  const el = $('#stats');
  el.replaceChildren();
  if (!st) return;
  const s = st.store;
  const parts = [
    ['traces', s.traces], ['spans', s.spans],
    ['MiB of ' + (s.maxBytes / 1048576).toFixed(0) + ' MiB', (s.bytes / 1048576).toFixed(1)],
    ['evicted traces', s.evictedTraces], ['rejected spans', s.rejectedSpans],
  ];
  if (st.receiver) parts.push(['OTLP requests', st.receiver.requests], ['bad requests',
    st.receiver.badRequest + st.receiver.tooLarge + st.receiver.unsupportedMediaType + st.receiver.methodNotAllowed]);
  parts.forEach(([k, v], i) => {
    if (i) el.append(' · ');
    el.append(h('b', { text: String(v) }), ' ' + k);
  });
  $('#request-count').textContent = total ? `(${total})` : '';
}

function renderList() {
  const q = $('#filter').value.trim().toLowerCase();
  const rows = state.requests.filter((r) => !q || [r.request_id, r.trace_id, r.root, ...(r.services || [])]
    .some((s) => (s || '').toLowerCase().includes(q)));
  const maxDur = Math.max(1e-9, ...rows.map((r) => Math.abs(r.duration_ms)));
  const tbody = $('#requests tbody');
  tbody.replaceChildren(...rows.map((r) => {
    const tr = h('tr', {
      class: r.error ? 'error-row' : '',
      dataset: { traceId: r.trace_id },
      onclick: () => { location.hash = '#/trace/' + r.trace_id; },
      title: 'Open trace ' + r.trace_id,
    },
    h('td', { class: 'mono' }, fmtClock(r.start_us)),
    h('td', { class: 'mono' }, r.request_id || '—', r.error ? h('span', { class: 'badge', text: 'error' }) : null,
      r.negative_spans ? h('span', { class: 'badge', text: 'negative duration',
        title: `${r.negative_spans} span(s) end before they start; durations shown as recorded` }) : null,
      r.truncated ? h('span', { class: 'badge', text: 'truncated',
        title: 'the collector refused spans of this trace (a store limit): it is incomplete' }) : null),
    h('td', { class: 'mono', title: r.trace_id }, r.trace_id.slice(0, 12) + '…'),
    h('td', {}, r.root),
    h('td', { class: 'num dur-cell' },
      h('div', { class: 'dur-bar', style: { width: (100 * Math.max(0, r.duration_ms) / maxDur).toFixed(2) + '%' } }),
      h('span', { text: fmtDur(r.duration_ms) })),
    h('td', { class: 'num', title: r.ttft_source ? 'from ' + r.ttft_source : '' }, fmtDur(r.ttft_ms)),
    h('td', { class: 'num', title: hitTitle(r) }, fmtPct(r.hit_rate)),
    h('td', {}, (r.services || []).slice().sort(serviceOrder).map((svc) => chip(svc))),
    h('td', { class: 'num' }, String(r.n_spans)));
    return tr;
  }));
  $('#empty').hidden = state.requests.length > 0;
}

// hitTitle explains cb.request's hit statistics (contract/spans.yaml names): the two legs
// and what each searched, or why there was no lookup result.
function hitTitle(r) {
  if (r.requested_tokens === undefined || r.requested_tokens === null) return '';
  if (r.lookup && r.lookup !== 'done') return `no lookup result (lookup: ${r.lookup}); ${r.requested_tokens} tokens computed`;
  const cov = r.prefix_coverage_tokens ?? '?';
  const rest = r.n_non_prefix_tokens ?? '?';
  return `hit ${r.hit_tokens ?? '?'} of ${r.requested_tokens} tokens: prefix ${r.prefix_hit_tokens ?? '?'} of ${cov} covered` +
    ` + non-prefix ${r.non_prefix_hit_tokens ?? '?'} of ${rest}`;
}

// ---------------------------------------------------------------- one trace

async function loadTrace(id) {
  const [tr, bd, sum, linked] = await Promise.all([
    api('/api/traces/' + encodeURIComponent(id)),
    api('/api/traces/' + encodeURIComponent(id) + '/breakdown'),
    api('/api/requests?traceID=' + encodeURIComponent(id)),
    api('/api/traces/' + encodeURIComponent(id) + '/linked'),
  ]);
  return { trace: tr.data[0], bd: bd.data, summary: (sum.data || [])[0] || null,
    linked: linked.data || [], linkedTotal: linked.total || 0 };
}

function renderTrace({ trace, bd, summary, linked, linkedTotal }) {
  const jspans = new Map(trace.spans.map((s) => [s.spanID, s]));
  const services = [...new Set(bd.spans.map((s) => s.service))].sort(serviceOrder);
  // One lane per process instance: the prefill and the decode engine, or the engines of two
  // nodes, share a service name but not a lane.
  const lanes = laneOrder(bd.lanes || services.map((svc) => ({ name: svc, service: svc })));

  // The time axis covers every span, also those sticking out of the root (clock skew, async).
  let lo = 0, hi = bd.durationNs;
  for (const s of bd.spans) { lo = Math.min(lo, s.startNs); hi = Math.max(hi, s.startNs + s.durationNs); }
  const span = Math.max(1, hi - lo);
  const pct = (ns) => (100 * (ns - lo) / span);

  $('#trace-title').replaceChildren(bd.requestID ? 'Request ' + bd.requestID : 'Trace',
    h('span', { class: 'muted', text: '  ' + bd.rootName }));
  renderFacts(bd, summary, lanes);
  renderLinked(trace, summary, linked || [], linkedTotal || 0);
  $('#legend').replaceChildren(...services.map((svc) => chip(svc)));
  renderLanes(bd, lanes, pct);
  renderWaterfall(bd, jspans, trace, pct, lo, hi);
  renderBreakdown(bd);
  renderSpanTimes(bd);
}

function renderFacts(bd, s, lanes) {
  const fact = (label, value, props) => h('div', {}, h('dt', { text: label }), h('dd', props || {}, value));
  const facts = [
    fact('Request id', bd.requestID || '—', { class: 'mono' }),
    fact('Trace id', bd.traceID, { class: 'mono' }),
    fact('Root span', bd.rootName),
    fact('Start', fmtDateTime(bd.startUnixNano / 1000)),
    fact('Duration', fmtDur(bd.durationNs / 1e6), { id: 'trace-duration', dataset: { ns: String(bd.durationNs) } }),
    fact('TTFT', s ? fmtDur(s.ttft_ms) + (s.ttft_source ? ` (${s.ttft_source})` : '') : '—'),
    fact('Hit rate', s && s.hit_rate !== null ? fmtPct(s.hit_rate) + (hitTitle(s) ? ' — ' + hitTitle(s) : '') : '—'),
    fact('Spans', String(bd.spans.length)),
    fact('Processes', String(lanes.length)),
  ];
  if (bd.detached) facts.push(fact('Detached spans', `${bd.detached} (parent missing; shown under the root)`));
  $('#trace-facts').replaceChildren(...facts);
}

// tagMap turns a span's Jaeger tags into an object.
function tagMap(tags) {
  const m = {};
  for (const t of tags || []) m[t.key] = t.value;
  return m;
}

function traceLink(id) {
  return h('a', { class: 'mono', href: '#/trace/' + id, title: 'trace ' + id }, id.slice(0, 12) + '…');
}

function fmtNum(v, digits) {
  const n = Number(v);
  return v === undefined || v === null || Number.isNaN(n) ? '—' : n.toFixed(digits);
}

// qualityBox renders one cb.quality check (contract/spans.yaml): how far the reused KV
// moved the answer from a full prefill's, next to the request's reuse.
function qualityBox(ls) {
  const a = tagMap(ls.tags);
  const n = Number(a.positions);
  const agree = Math.round(Number(a.top1) * n);
  if (ls.error || a.first_kl === undefined) {
    return h('div', { class: 'box warn quality', dataset: { traceId: ls.traceID } },
      'quality check failed (', a['error.type'] || 'no figures', ') — in trace ', traceLink(ls.traceID));
  }
  return h('div', { class: 'box quality', dataset: { traceId: ls.traceID, firstKl: String(a.first_kl) },
    title: 'The worker\'s online quality check: the same prompt prefilled in full, off the request\'s path, ' +
      'and the next-token distributions compared over the first output positions (teacher-forced).' },
  'quality: first-token KL ', h('b', { text: fmtNum(a.first_kl, 4) }),
  ' · mean KL ', h('b', { text: fmtNum(a.mean_kl, 4) }), ` over ${n} tokens`,
  ' · top-1 ', h('b', { text: `${agree}/${n}` }),
  ' · greedy match ', h('b', { text: `${a.greedy_match}/${n}` }),
  ' · recompute ratio ', fmtPct(Number(a.recomp_ratio)), a.selected !== undefined ? `, ${a.selected} tokens selected` : '',
  a.full_ms !== undefined ? ` · full prefill in the check ${fmtDur(Number(a.full_ms))}` : '',
  ' — checked in trace ', traceLink(ls.traceID));
}

// renderLinked shows, next to the facts, the spans of other traces that link to this one
// (the request's quality check), and the traces this one links to (what a check checked).
function renderLinked(trace, summary, linked, total) {
  const el = $('#linked');
  const boxes = linked.map((ls) => (ls.name === 'cb.quality' ? qualityBox(ls)
    : h('div', { class: 'box' }, 'linked from ', h('b', { text: ls.name }), ` (${ls.service}) in trace `, traceLink(ls.traceID))));
  if (total > linked.length) boxes.push(h('div', { class: 'box none', text: `and ${total - linked.length} more linking spans` }));
  if (!linked.some((ls) => ls.name === 'cb.quality') && summary && summary.non_prefix_hit_tokens > 0) {
    boxes.push(h('div', { class: 'box none quality-none' },
      'quality: not checked — no cb.quality check links to this request (the worker checks a sampled share of ' +
      'blended requests, --quality-sample-rate, or a request asking "cacheblend": {"quality_check": true}; ' +
      'a check taken while the checker is busy is dropped)'));
  }
  const out = new Map();
  for (const s of trace.spans) {
    for (const r of s.references || []) {
      if (r.refType === 'FOLLOWS_FROM' && r.traceID && r.traceID !== trace.traceID && !out.has(r.traceID)) out.set(r.traceID, s.operationName);
    }
  }
  for (const [tid, name] of out) {
    boxes.push(h('div', { class: 'box links-to' }, h('b', { text: name }), ' links to trace ', traceLink(tid),
      name === 'cb.quality' ? ' — the request it checked' : ''));
  }
  el.hidden = boxes.length === 0;
  el.replaceChildren(...boxes);
}

function renderLanes(bd, laneList, pct) {
  const lanes = laneList.map((lane) => {
    const svc = lane.service;
    const spans = bd.spans.filter((s) => (s.lane || s.service) === lane.name).sort((a, b) => a.startNs - b.startNs);
    // Greedy packing: each span goes to the first row that is free at its start.
    const rowsEnd = [];
    const placed = spans.map((s) => {
      let row = rowsEnd.findIndex((end) => end <= s.startNs);
      if (row < 0) { row = rowsEnd.length; rowsEnd.push(0); }
      rowsEnd[row] = s.startNs + Math.max(s.durationNs, 1);
      return { s, row };
    });
    const track = h('div', { class: 'lane-track', style: { height: (Math.max(1, rowsEnd.length) * 22 + 2) + 'px' } },
      placed.map(({ s, row }) => h('div', {
        class: 'lane-bar',
        dataset: { spanId: s.spanID },
        title: `${s.name} · ${fmtDur(s.durationNs / 1e6)}`,
        style: {
          left: pct(s.startNs) + '%', width: `max(2px, ${(pct(s.startNs + s.durationNs) - pct(s.startNs)).toFixed(4)}%)`,
          top: (row * 22 + 2) + 'px', background: colorOf(svc),
        },
        onclick: () => selectSpan(s.spanID, true),
      }, s.name)));
    return h('div', { class: 'lane', dataset: { service: svc, instance: lane.instance || '', lane: lane.name } },
      h('div', { class: 'lane-label', title: lane.name }, h('span', { class: 'dot', style: { background: colorOf(svc) } }), svc,
        lane.instance ? h('span', { class: 'muted instance', text: '@' + lane.instance }) : null,
        h('span', { class: 'muted', text: `${spans.length}` })),
      track);
  });
  $('#lanes').replaceChildren(...lanes);
}

function fmtTick(ns, step) {
  if (ns === 0) return '0';
  if (step >= 1e9) return (ns / 1e9).toFixed(step % 1e9 === 0 ? 0 : 1) + ' s';
  if (step >= 1e6) return (ns / 1e6).toFixed(0) + ' ms';
  if (step >= 1e3) return (ns / 1e3).toFixed(0) + ' µs';
  return ns.toFixed(0) + ' ns';
}

function niceStep(totalNs, target) {
  const raw = totalNs / target;
  const pow = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

function renderWaterfall(bd, jspans, trace, pct, lo, hi) {
  const step = niceStep(hi - lo, 8);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) ticks.push(t);
  const axis = h('div', { class: 'wf-axis' },
    h('div', { class: 'wf-label muted', text: 'span' }),
    h('div', { class: 'wf-track' }, ticks.map((t) => h('div', { class: 'tick', style: { left: pct(t) + '%' } }, fmtTick(t, step)))));

  const crit = new Map();
  for (const seg of bd.criticalPath || []) {
    if (!crit.has(seg.spanID)) crit.set(seg.spanID, []);
    crit.get(seg.spanID).push(seg);
  }
  const rows = bd.spans.map((s) => {
    const left = pct(s.startNs), right = pct(s.startNs + s.durationNs);
    const segs = crit.get(s.spanID) || [];
    const track = h('div', { class: 'wf-track' },
      ticks.map((t) => h('div', { class: 'gridline', style: { left: pct(t) + '%' } })),
      h('div', { class: 'root-end', style: { left: pct(bd.durationNs) + '%' } }),
      h('div', {
        class: 'wf-bar' + (s.error ? ' error' : ''),
        style: { left: left + '%', width: `max(2px, ${(right - left).toFixed(4)}%)`, background: colorOf(s.service) },
      }),
      segs.map((g) => h('div', { class: 'crit', style: { left: pct(g.startNs) + '%', width: `max(1px, ${(pct(g.endNs) - pct(g.startNs)).toFixed(4)}%)` } })),
      h('div', { class: 'wf-dur', style: { left: right + '%' } }, fmtDur(s.durationNs / 1e6)));
    return h('div', {
      class: 'wf-row' + (segs.length ? ' on-critical' : ''),
      dataset: { spanId: s.spanID, service: s.service },
      title: `${s.name} (${s.lane || s.service})\nduration ${fmtDur(s.durationNs / 1e6)} · self ${fmtDur(s.selfNs / 1e6)} · critical ${fmtDur(s.criticalNs / 1e6)}`,
      onclick: () => selectSpan(s.spanID, false),
    },
    h('div', { class: 'wf-label', style: { paddingLeft: (8 + 14 * s.depth) + 'px' } },
      h('span', { class: 'dot', style: { background: colorOf(s.service) } }),
      h('span', { class: 'name', text: s.name }),
      h('span', { class: 'svc', text: s.service }),
      s.detached ? h('span', { class: 'detached', text: 'detached' }) : null),
    track);
  });
  $('#waterfall').replaceChildren(axis, ...rows);
  state.detail = { bd, jspans, trace };
  selectSpan(state.selected && jspans.has(state.selected) ? state.selected : bd.rootSpanID, false);
}

function selectSpan(spanID, scroll) {
  state.selected = spanID;
  for (const row of document.querySelectorAll('.wf-row')) row.classList.toggle('selected', row.dataset.spanId === spanID);
  const row = document.querySelector(`.wf-row[data-span-id="${CSS.escape(spanID)}"]`);
  if (scroll && row) row.scrollIntoView({ block: 'center', behavior: 'smooth' });
  renderDetail(spanID);
}

function renderDetail(spanID) {
  const { bd, jspans, trace } = state.detail || {};
  const panel = $('#span-detail');
  if (!bd) return;
  const s = bd.spans.find((x) => x.spanID === spanID);
  const js = jspans.get(spanID);
  if (!s || !js) { panel.replaceChildren(h('p', { class: 'muted', text: 'Span not found.' })); return; }
  const kv = (k, v, t) => h('tr', {}, h('td', { class: 'k', text: k }), h('td', { class: 'mono', text: v }), t !== undefined ? h('td', { class: 't', text: t }) : null);
  const timing = h('table', {},
    kv('span id', s.spanID), kv('parent', s.parentID || '—'), kv('kind', s.kind || '—'), kv('phase', s.phase),
    kv('start', '+' + fmtDur(s.startNs / 1e6)), kv('duration', fmtDur(s.durationNs / 1e6)),
    kv('self', fmtDur(s.selfNs / 1e6)), kv('attributed', fmtDur(s.attributedNs / 1e6)),
    kv('critical path', fmtDur(s.criticalNs / 1e6)));
  const tags = h('table', {}, (js.tags || []).map((t) => kv(t.key, String(t.value), t.type)));
  const logs = (js.logs || []).map((l) => h('div', {},
    h('div', { class: 'muted mono', text: '+' + fmtDur((l.timestamp * 1000 - bd.startUnixNano) / 1e6) }),
    h('table', {}, (l.fields || []).map((f) => kv(f.key, String(f.value), f.type)))));
  const proc = trace.processes[js.processID];
  const ptags = proc ? h('table', {}, (proc.tags || []).map((t) => kv(t.key, String(t.value), t.type))) : null;
  fill(panel,
    h('h3', { text: s.name }), chip(s.service, s.instance),
    s.detached ? h('p', { class: 'detached', text: 'Its parent is not in the trace; shown under the root.' }) : null,
    h('h4', { text: 'Timing' }), timing,
    h('h4', { text: `Attributes (${(js.tags || []).length})` }), tags,
    logs.length ? h('h4', { text: `Events (${logs.length})` }) : null, logs,
    ptags ? h('h4', { text: 'Process' }) : null, ptags);
}

function renderBreakdown(bd) {
  const total = bd.groups.reduce((a, g) => a + g.attributedNs, 0);
  const maxFrac = Math.max(1e-9, ...bd.groups.map((g) => g.fraction));
  $('#breakdown tbody').replaceChildren(...bd.groups.map((g) => h('tr', {
    class: 'group', dataset: { ns: String(g.attributedNs), service: g.service, lane: g.lane || g.service, phase: g.phase },
  },
  h('td', {}, chip(g.service, g.instance)),
  h('td', { text: g.phase }),
  h('td', { class: 'num', text: String(g.spans) }),
  h('td', { class: 'num ms', text: msFixed(g.attributedNs) }),
  h('td', { class: 'share' },
    h('span', { class: 'share-bar', style: { width: (160 * g.fraction / maxFrac).toFixed(1) + 'px', background: colorOf(g.service) } }),
    fmtPct(g.fraction)),
  h('td', { class: 'num', text: msFixed(g.selfNs) }),
  h('td', { class: 'num', text: msFixed(g.criticalNs) }))));
  const sum = (f) => bd.groups.reduce((a, g) => a + g[f], 0);
  $('#breakdown tfoot').replaceChildren(h('tr', {},
    h('td', { text: 'Total' }),
    h('td', {}),
    h('td', { class: 'num', text: String(sum('spans')) }),
    h('td', { class: 'num', id: 'breakdown-total', dataset: { ns: String(total) }, text: msFixed(total) }),
    h('td', { class: 'share muted', text: `${fmtPct(bd.durationNs ? total / bd.durationNs : 0)} of ${bd.rootName} (${msFixed(bd.durationNs)} ms)` }),
    h('td', { class: 'num muted', title: 'Self times overlap where spans run side by side, so they need not add up.', text: '—' }),
    h('td', { class: 'num', text: msFixed(sum('criticalNs')) })));
  const path = bd.criticalPath || [];
  $('#critical-bar').replaceChildren(...path.map((seg) => {
    const frac = bd.durationNs ? (seg.endNs - seg.startNs) / bd.durationNs : 0;
    return h('div', {
      class: 'cp-seg',
      title: `${seg.name} (${seg.service}) ${fmtDur((seg.endNs - seg.startNs) / 1e6)}`,
      style: { width: (100 * frac).toFixed(4) + '%', background: colorOf(seg.service) },
      onclick: () => selectSpan(seg.spanID, true),
    }, frac > 0.12 ? seg.name : '');
  }));
  $('#critical-path').replaceChildren(...path.map((seg) => h('li', {
    dataset: { spanId: seg.spanID }, onclick: () => selectSpan(seg.spanID, true), style: { cursor: 'pointer' },
  }, h('span', { class: 'dot', style: { background: colorOf(seg.service), marginRight: '6px' } }), seg.name,
  h('span', { class: 'ms', text: `${fmtDur((seg.endNs - seg.startNs) / 1e6)} (+${fmtDur(seg.startNs / 1e6)})` }))));
}

function renderSpanTimes(bd) {
  const spans = bd.spans.slice().sort((a, b) => b.selfNs - a.selfNs);
  $('#span-times tbody').replaceChildren(...spans.map((s) => h('tr', {
    onclick: () => selectSpan(s.spanID, true), style: { cursor: 'pointer' },
  },
  h('td', {}, s.name), h('td', {}, chip(s.service, s.instance)), h('td', { text: s.phase }),
  h('td', { class: 'num', text: msFixed(s.durationNs) }), h('td', { class: 'num', text: msFixed(s.selfNs) }),
  h('td', { class: 'num', text: msFixed(s.attributedNs) }), h('td', { class: 'num', text: msFixed(s.criticalNs) }))));
}

// ---------------------------------------------------------------- routing

function stopTimer() { if (state.timer) { clearInterval(state.timer); state.timer = null; } }

function startTimer() {
  stopTimer();
  if ($('#autorefresh').checked) state.timer = setInterval(loadList, REFRESH_MS);
}

async function route() {
  const m = location.hash.match(/^#\/trace\/([0-9a-fA-F]{1,32})$/);
  showError(null);
  if (m) {
    stopTimer();
    $('#list-view').hidden = true;
    $('#trace-view').hidden = false;
    if (state.traceID !== m[1]) state.selected = null;
    state.traceID = m[1];
    try {
      renderTrace(await loadTrace(m[1]));
      document.title = 'cacheblend · trace ' + m[1].slice(0, 12);
    } catch (err) {
      showError(err);
    }
    return;
  }
  state.traceID = null;
  $('#trace-view').hidden = true;
  $('#list-view').hidden = false;
  document.title = 'cacheblend · traces';
  await loadList();
  startTimer();
}

document.addEventListener('DOMContentLoaded', () => {
  document.body.classList.toggle('show-critical', $('#show-critical').checked);
  $('#show-critical').addEventListener('change', (e) => document.body.classList.toggle('show-critical', e.target.checked));
  $('#filter').addEventListener('input', renderList);
  $('#refresh').addEventListener('click', () => (state.traceID ? route() : loadList()));
  $('#autorefresh').addEventListener('change', () => (state.traceID ? stopTimer() : startTimer()));
  window.addEventListener('hashchange', route);
  route();
});
