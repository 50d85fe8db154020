// Charts drawn as SVG elements by the console itself: no library, nothing fetched, and
// no style attribute (the Content-Security-Policy forbids inline styles). Colours and
// dashes come from console.css through each element's class.
//
// A history answer has a point only for a bucket with activity. Counts of a missing
// bucket are 0; the queue depth and the oldest queued age are read only at the end of
// a bucket with activity, so they are drawn as steps between the values read, never
// guessed before the first or after the last. Every chart has a text alternative: an
// aria-label summary and a table of the numbers in a <details>.
import { age, h, replace } from "./dom.js";

// The SVG namespace: an identifier, never fetched.
const SVG_NS = "http://www.w3.org/2000/svg";
const HEIGHT = 170;
const MARGIN = { left: 46, right: 10, top: 10, bottom: 24 };
// At most this many columns in a chart: a longer window's buckets are combined.
const MAX_BINS = 180;
// The widths a column may have, in seconds, when buckets are combined.
const NICE_SECONDS = [
  1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
];

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// -- formats -----------------------------------------------------------------------------

// Seconds -> "1 min", "30 s", "2 h": the width of one column.
export function spanText(seconds) {
  if (seconds % 3600 === 0) return seconds === 3600 ? "hour" : `${seconds / 3600} h`;
  if (seconds % 60 === 0) return seconds === 60 ? "minute" : `${seconds / 60} min`;
  return seconds === 1 ? "second" : `${seconds} s`;
}

// A time in UTC: "04:31" within a day, "11-26 04:31" over a week; "04:31:30" when
// the columns are narrower than a minute (`when.seconds`).
export function clock(ms, when = {}) {
  const iso = new Date(ms).toISOString();
  if (when.long) return `${iso.slice(5, 10)} ${iso.slice(11, 16)}`;
  return iso.slice(11, when.seconds ? 19 : 16);
}

// A duration in seconds: "0.1 s", "2 s", "5 min", "1 h", "1 h 12 min".
export function seconds(value) {
  if (value === null || value === undefined) return "—";
  if (value < 60) return `${Number(value.toPrecision(3))} s`;
  if (value % 3600 === 0) return `${value / 3600} h`;
  return value < 3600 && value % 60 === 0 ? `${value / 60} min` : age(value);
}

function count(value) {
  return value === null || value === undefined ? "—" : String(value);
}

// Round tops for an axis of seconds: 1 s ... 1 min, 2 min ... 1 d.
const NICE_TIMES = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400];

// 0 < max -> a round number at or above it, for the top of the axis; `times`: one that
// reads well as a duration (`max` in seconds).
function niceCeil(max, times = false) {
  if (max <= 0) return 1;
  if (times && max >= 1) return NICE_TIMES.find((t) => t >= max) || Math.ceil(max / 86400) * 86400;
  const power = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= max) return step * power;
  return 10 * power;
}

// -- columns -----------------------------------------------------------------------------

// The answer's points spread over the window's columns. `keys` are summed over the
// buckets of a column (a missing bucket counts 0); `levels` keep the last value read in
// the column (null when none was); `peaks` the highest. Answers {columns, width}: each
// column {at (ms), values: {key: number|null}, points: how many buckets had activity}.
export function columns(answer, windowSeconds, { keys = [], levels = [], peaks = [] }) {
  const interval = answer.interval_seconds;
  const need = (windowSeconds / interval) / MAX_BINS;
  const width =
    NICE_SECONDS.find((s) => s >= interval * need && s % interval === 0) ||
    interval * Math.max(1, Math.ceil(need));
  const w = width * 1000;
  const times = answer.points.map((p) => Date.parse(p.at));
  // The browser's clock may lag the gateway's: the last point is never left out.
  const now = Math.max(Date.now(), ...times.map((t) => t + interval * 1000));
  const last = Math.floor((now - 1) / w) * w;
  const first = Math.floor((now - windowSeconds * 1000) / w) * w;
  const cols = [];
  for (let at = first; at <= last; at += w) {
    const values = {};
    for (const k of keys) values[k] = 0;
    for (const k of [...levels, ...peaks]) values[k] = null;
    cols.push({ at, values, points: 0 });
  }
  answer.points.forEach((p, i) => {
    const col = cols[Math.floor((times[i] - first) / w)];
    if (!col) return;
    col.points += 1;
    for (const k of keys) col.values[k] += p[k];
    for (const k of levels) if (p[k] !== null) col.values[k] = p[k];
    for (const k of peaks) {
      if (p[k] !== null) col.values[k] = col.values[k] === null ? p[k] : Math.max(col.values[k], p[k]);
    }
  });
  return { columns: cols, width };
}

// -- a chart -----------------------------------------------------------------------------

// One series' path: `gaps` says how columns without a value are drawn. "zero": they
// are 0, one line through every column. "hold": a step from each value read to the
// next one (the value holds until then), nothing before the first or after the last.
// "break": a line between neighbouring columns that both have a value.
function pathOf(values, gaps, x, y) {
  const parts = [];
  let previous = null; // index of the last column with a value
  values.forEach((v, i) => {
    if (gaps === "zero") {
      parts.push(`${i ? "L" : "M"}${x(i)},${y(v)}`);
    } else if (v !== null) {
      if (previous === null || (gaps === "break" && previous !== i - 1)) parts.push(`M${x(i)},${y(v)}`);
      else if (gaps === "hold") parts.push(`H${x(i)}V${y(v)}`);
      else parts.push(`L${x(i)},${y(v)}`);
      previous = i;
    }
  });
  return parts.join("");
}

function legend(series) {
  return h(
    "ul",
    { class: "legend" },
    series.map((s) =>
      h(
        "li",
        {},
        svg(
          "svg",
          { class: "swatch", width: 22, height: 10, "aria-hidden": "true", focusable: "false" },
          svg("line", { class: `line ${s.cls}`, x1: 1, y1: 5, x2: 21, y2: 5 }),
        ),
        s.label,
      ),
    ),
  );
}

// A chart in a <figure>: `title`; `series`, each {key, label, cls, gaps}; `format(v)`
// writes a value, and `times` says its values are seconds; `note`, a sentence on how to
// read it, in the caption of the table.
// Answers {el, draw(cols, width, long)}: draw() takes columns() of an answer (and
// whether the window is long enough to write the date), and may be called again at every
// refresh: the column the user chose with the keyboard or the pointer stays chosen.
export function chart({ id, title, series, format = count, times = false, note = "" }) {
  const picture = h("div", { class: "plot" });
  const readout = h("p", { class: "readout muted", "aria-live": "polite" });
  const unit = h("span", { class: "unit muted" });
  const table = h("div", { class: "scroll" });
  const details = h("details", { class: "numbers" }, h("summary", {}, `${title}: the numbers`), table);
  const el = h(
    "figure",
    { class: "chart", id },
    h("figcaption", {}, h("span", { class: "title" }, title), unit, legend(series)),
    picture,
    readout,
    details,
  );
  let chosenAt = null;
  let last = null;

  function valuesAt(col) {
    return series.map((s) => `${format(col.values[s.key])} ${s.label.toLowerCase()}`).join(", ");
  }

  function draw(cols, width, long) {
    last = { cols, width, long };
    const when = { long, seconds: width % 60 !== 0 };
    const n = cols.length;
    const W = Math.max(260, Math.round(picture.clientWidth || 600));
    const plotW = W - MARGIN.left - MARGIN.right;
    const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
    const all = cols.flatMap((c) => series.map((s) => c.values[s.key])).filter((v) => v !== null);
    const top = niceCeil(Math.max(0, ...all), times);
    const x = (i) => Math.round((MARGIN.left + ((i + 0.5) * plotW) / n) * 10) / 10;
    const y = (v) => Math.round((MARGIN.top + plotH - (v / top) * plotH) * 10) / 10;
    const span = spanText(width);
    const grid = [0, top / 2, top].map((v) => [
      svg("line", { class: "grid", x1: MARGIN.left, x2: W - MARGIN.right, y1: y(v), y2: y(v) }),
      svg("text", { class: "tick", x: MARGIN.left - 4, y: y(v) + 4, "text-anchor": "end" }, format(v)),
    ]);
    const ticks = [0, Math.floor((n - 1) / 2), n - 1].map((i, k) =>
      svg(
        "text",
        { class: "tick", x: x(i), y: HEIGHT - 6, "text-anchor": ["start", "middle", "end"][k] },
        clock(cols[i].at, when),
      ),
    );
    const lines = series.map((s) => {
      const values = cols.map((c) => c.values[s.key]);
      const marks =
        s.gaps === "zero"
          ? []
          : values.map((v, i) =>
              v === null ? null : svg("circle", { class: `dot ${s.cls}`, cx: x(i), cy: y(v), r: 2.5 }),
            );
      return [svg("path", { class: `line ${s.cls}`, d: pathOf(values, s.gaps, x, y) }), marks];
    });
    let index = chosenAt === null ? -1 : cols.findIndex((c) => c.at === chosenAt);
    const cursor = svg("line", {
      class: "cursor",
      y1: MARGIN.top,
      y2: MARGIN.top + plotH,
      visibility: "hidden",
    });
    const picture_ = svg(
      "svg",
      {
        width: "100%",
        height: HEIGHT,
        viewBox: `0 0 ${W} ${HEIGHT}`,
        preserveAspectRatio: "none",
        role: "img",
        tabindex: 0,
        "aria-label": summary(title, series, cols, width, when, format),
      },
      grid,
      ticks,
      lines,
      cursor,
    );

    replace(unit, `per ${span}, UTC`);

    function choose(i) {
      index = Math.max(0, Math.min(n - 1, i));
      chosenAt = cols[index].at;
      cursor.setAttribute("x1", x(index));
      cursor.setAttribute("x2", x(index));
      cursor.setAttribute("visibility", "visible");
      const { at } = cols[index];
      replace(readout, `${clock(at, when)}–${clock(at + width * 1000, when)} UTC: ${valuesAt(cols[index])}`);
    }
    picture_.addEventListener("keydown", (event) => {
      const moves = { ArrowLeft: index - 1, ArrowRight: index + 1, Home: 0, End: n - 1 };
      if (!(event.key in moves)) return;
      event.preventDefault();
      choose(index < 0 ? n - 1 : moves[event.key]);
    });
    picture_.addEventListener("pointermove", (event) => {
      const box = picture_.getBoundingClientRect();
      const at = ((event.clientX - box.left) / box.width) * W;
      choose(Math.floor(((at - MARGIN.left) / plotW) * n));
    });
    const focused = picture.contains(document.activeElement);
    replace(picture, picture_);
    if (focused) picture_.focus({ preventScroll: true });
    if (index >= 0) choose(index);
    else replace(readout, "Arrow keys or the pointer on the chart read one column's numbers.");
    drawTable(cols, width, when);
  }

  function drawTable(cols, width, when) {
    const active = (c, s) => (s.gaps === "zero" ? c.values[s.key] > 0 : c.values[s.key] !== null);
    const shown = cols.filter((c) => series.some((s) => active(c, s)));
    replace(
      table,
      h(
        "table",
        {},
        h("caption", { class: "muted" }, `Per ${spanText(width)} from the time shown (UTC). ${note}`),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            h("th", { scope: "col" }, "From (UTC)"),
            series.map((s) => h("th", { scope: "col", class: "num" }, s.label)),
          ),
        ),
        h(
          "tbody",
          {},
          shown.length
            ? shown.map((c) =>
                h(
                  "tr",
                  { "data-at": new Date(c.at).toISOString() },
                  h("th", { scope: "row" }, clock(c.at, when)),
                  series.map((s) => h("td", { class: "num", "data-key": s.key }, format(c.values[s.key]))),
                ),
              )
            : h("tr", {}, h("td", { colspan: series.length + 1 }, "No activity in this window.")),
        ),
      ),
    );
  }

  const shown = {
    el,
    draw,
    drawn: () => last !== null,
    redraw: () => last && draw(last.cols, last.width, last.long),
  };
  // The charts of pages left behind (drawn once, and no longer on the page) are dropped.
  for (const c of live) if (c.drawn() && !c.el.isConnected) live.delete(c);
  live.add(shown);
  return shown;
}

// The charts made, to draw again to the window's width when it changes: one listener
// for them all, which forgets the charts no longer on the page.
const live = new Set();
window.addEventListener("resize", () => {
  for (const c of live) {
    if (c.el.isConnected) c.redraw();
    else live.delete(c);
  }
});

// The aria-label: what the chart shows, with its numbers in a sentence.
function summary(title, series, cols, width, when, format) {
  const span = spanText(width);
  const parts = series.map((s) => {
    const known = cols.filter((c) => c.values[s.key] !== null);
    if (s.gaps === "zero") {
      const total = known.reduce((a, c) => a + c.values[s.key], 0);
      if (!total) return `${s.label}: none`;
      const top = known.reduce((a, c) => (c.values[s.key] > a.values[s.key] ? c : a));
      return `${s.label}: ${total} in all, at most ${top.values[s.key]} per ${span} (from ${clock(top.at, when)})`;
    }
    if (!known.length) return `${s.label}: not read in this window`;
    const end = known[known.length - 1];
    const top = known.reduce((a, c) => (c.values[s.key] > a.values[s.key] ? c : a));
    return (
      `${s.label}: read in ${known.length} of ${cols.length} columns, last ${format(end.values[s.key])} ` +
      `(from ${clock(end.at, when)}), highest ${format(top.values[s.key])} (from ${clock(top.at, when)})`
    );
  });
  return `${title}, per ${span} (UTC). ${parts.join("; ")}.`;
}

// -- a sparkline -------------------------------------------------------------------------

// A runtime's queue depth over the last `windowSeconds`, drawn in a table's cell:
// `points` are [{at, depth}], oldest first, one per bucket with activity. Steps between
// the depths read, a dot at the last one; the label says the numbers.
export function sparkline(points, windowSeconds) {
  const W = 120;
  const H = 26;
  const times = points.map((p) => Date.parse(p.at));
  const end = Math.max(Date.now(), ...times);
  const start = end - windowSeconds * 1000;
  const top = niceCeil(Math.max(0, ...points.map((p) => p.depth)));
  const x = (t) => Math.round((2 + ((t - start) / (end - start)) * (W - 4)) * 10) / 10;
  const y = (v) => Math.round((H - 3 - (v / top) * (H - 6)) * 10) / 10;
  const d = points
    .map((p, i) => `${i ? "H" : "M"}${x(times[i])}${i ? "V" : ","}${y(p.depth)}`)
    .join("");
  const lastAt = times[times.length - 1];
  let label = "Queue depth, last hour: not read (no activity)";
  if (points.length) {
    const depths = points.map((p) => p.depth);
    const lastPoint = points[points.length - 1];
    label =
      `Queue depth, last hour: read ${points.length} times, from ${Math.min(...depths)} to ` +
      `${Math.max(...depths)}, last ${lastPoint.depth} at ${clock(Date.parse(lastPoint.at))} UTC`;
  }
  return svg(
    "svg",
    { class: "sparkline", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label },
    svg("title", {}, label),
    svg("line", { class: "base", x1: 0, x2: W, y1: H - 3, y2: H - 3 }),
    points.length ? svg("path", { class: "line s-depth", d }) : null,
    points.length
      ? svg("circle", { class: "dot s-depth", cx: x(lastAt), cy: y(points.at(-1).depth), r: 2 })
      : null,
  );
}
