// The history's charts (GET /v1/history, GET /v1/runtimes/{rt}/history): the fleet's
// enqueued and completed tasks on the runtimes page, and a runtime's throughput, queue
// depth, oldest queued age and claim wait on its page, over a window the user picks.
import { call, path } from "./api.js";
import { chart, columns, seconds } from "./chart.js";
import { h, replace } from "./dom.js";

export const WINDOWS = [
  ["1h", 3600, "Last hour"],
  ["24h", 86400, "Last 24 hours"],
  ["7d", 7 * 86400, "Last 7 days"],
];

const SPARSE =
  "Only times with activity are listed: any other had none (counts 0). The queue depth " +
  "and the oldest queued age are read when a minute (a bucket) with activity ends; " +
  "between two readings the chart holds the earlier value, and a dash means not read.";

// The fleet's chart, above the runtimes: what every runtime the token covers enqueued
// and completed over the last hour. Answers {el, refresh}.
export function fleetPanel(page) {
  const throughput = chart({
    id: "fleet-chart",
    title: "Enqueued and completed, all runtimes",
    series: [
      { key: "enqueued", label: "Enqueued", cls: "s-enqueued", gaps: "zero" },
      { key: "completed", label: "Completed", cls: "s-completed", gaps: "zero" },
    ],
    note: "Only times with activity are listed: any other had none.",
  });
  async function refresh() {
    const { body } = await call("GET", path.fleetHistory(), { window: "1h" });
    if (page.stale()) return;
    const { columns: cols, width } = columns(body, 3600, { keys: ["enqueued", "completed"] });
    throughput.draw(cols, width, false);
  }
  const el = h(
    "section",
    { class: "charts fleet", "aria-label": "All runtimes, last hour" },
    throughput.el,
  );
  return { el, refresh };
}

// A runtime's charts with a control for the window. Answers {el, refresh}.
export function runtimeHistoryPanel(rt, page) {
  let windowName = "1h";
  const charts = [
    chart({
      id: "throughput-chart",
      title: "Throughput",
      series: [
        { key: "enqueued", label: "Enqueued", cls: "s-enqueued", gaps: "zero" },
        { key: "completed", label: "Completed", cls: "s-completed", gaps: "zero" },
        { key: "failed", label: "Failed", cls: "s-failed", gaps: "zero" },
        { key: "dead", label: "Dead", cls: "s-dead", gaps: "zero" },
      ],
      note: SPARSE,
    }),
    chart({
      id: "depth-chart",
      title: "Queue depth",
      series: [{ key: "depth", label: "Queued", cls: "s-depth", gaps: "hold" }],
      note: SPARSE,
    }),
    chart({
      id: "age-chart",
      title: "Oldest queued age",
      series: [{ key: "oldest_queued_age_seconds", label: "Oldest age", cls: "s-age", gaps: "hold" }],
      format: seconds,
      times: true,
      note: SPARSE,
    }),
    chart({
      id: "wait-chart",
      title: "Claim wait",
      series: [
        { key: "claim_wait_p50_seconds", label: "p50", cls: "s-p50", gaps: "break" },
        { key: "claim_wait_p95_seconds", label: "p95", cls: "s-p95", gaps: "break" },
      ],
      format: seconds,
      times: true,
      note:
        "From enqueue (or from a delayed task's run_at) to its first claim, read from fixed " +
        "wait buckets (the upper bound of the one a wait falls in). A dash: no first claim.",
    }),
  ];
  const choices = h("div", { class: "filters", role: "group", "aria-label": "Window of the charts" });
  const span = h("p", { class: "muted stamp" });

  function drawChoices() {
    replace(
      choices,
      WINDOWS.map(([name, , label]) => {
        const b = h("button", { type: "button", "aria-pressed": String(name === windowName) }, label);
        b.addEventListener("click", async () => {
          windowName = name;
          drawChoices();
          choices.querySelector('[aria-pressed="true"]').focus();
          await refresh().catch((err) => page.failed(err, span));
        });
        return b;
      }),
    );
  }
  drawChoices();

  async function refresh() {
    const asked = windowName;
    const { body } = await call("GET", path.history(rt), { window: asked });
    if (page.stale() || asked !== windowName) return;
    const [, windowSeconds, label] = WINDOWS.find(([name]) => name === asked);
    const long = windowSeconds > 86400;
    const { columns: cols, width } = columns(body, windowSeconds, {
      keys: ["enqueued", "completed", "failed", "dead"],
      levels: ["depth", "oldest_queued_age_seconds"],
      peaks: ["claim_wait_p50_seconds", "claim_wait_p95_seconds"],
    });
    const combined = width > body.interval_seconds;
    replace(
      span,
      `${label}, ${body.points.length} ${body.points.length === 1 ? "bucket" : "buckets"} with activity` +
        (combined
          ? `; each column adds up ${width / body.interval_seconds} buckets of ${body.interval_seconds} s ` +
            "(depth and age: the last read; waits: the highest)."
          : "."),
    );
    for (const c of charts) c.draw(cols, width, long);
  }

  const el = h(
    "section",
    { class: "history", "aria-label": "History" },
    choices,
    span,
    h("div", { class: "charts" }, charts.map((c) => c.el)),
  );
  return { el, refresh };
}
