// The console: runtimes, a runtime, a task, the failing runtimes. Hash routes (#/,
// #/runtime/ID, #/task/ID, #/failing) so that the gateway serves one page; data comes
// from the public API. The history's charts (history.js, drawn by chart.js), a runtime's
// failures and bulk actions and the failing view (failures.js), its controls
// (controls.js) and schedules (schedules.js), and a task's page (task.js), are modules
// of their own.
import { ApiError, call, path, problemText, session } from "./api.js";
import { controlsPanel } from "./controls.js";
import { sparkline } from "./chart.js";
import { age, badge, h, pager, replace, time } from "./dom.js";
import { failuresPanel, showFailing } from "./failures.js";
import { fleetPanel, runtimeHistoryPanel } from "./history.js";
import { loadPanel } from "./load.js";
import { schedulesPanel } from "./schedules.js";
import { showTask } from "./task.js";

// A sign-in link, /console#token=..., carries the token in the fragment, which the
// browser never sends to the server. Keep it for this tab and take it out of the
// address bar (and so out of the history) before anything else runs.
if (location.hash.startsWith("#token=")) {
  const token = decodeURIComponent(location.hash.slice("#token=".length));
  if (token) session.signIn(token);
  history.replaceState(null, "", location.pathname + location.search + "#/");
}

const REFRESH_MS = 5000;
const RUNTIMES_PER_PAGE = 50;
const TASKS_PER_PAGE = 20;
const STATUSES = ["queued", "claimed", "completed", "dead", "expired", "cancelled"];

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const signout = document.getElementById("signout");
const failingLink = document.getElementById("failing-link");
const load = document.getElementById("load");
const refreshLoad = loadPanel(load);
let view = null; // {refresh(): Promise<void>}
let generation = 0; // bumped on every navigation, so a late answer is dropped

signout.addEventListener("click", () => {
  session.signOut();
  showSignIn("Signed out.");
});

// An error of a refresh or a page load: a refused token goes back to sign-in.
function failed(err, where) {
  if (err instanceof ApiError && err.status === 401) {
    session.signOut();
    showSignIn(`The gateway refused the token: ${err.problem.detail || "not valid"}.`);
    return;
  }
  replace(where, h("p", { class: "error", role: "alert" }, problemText(err)));
}

// What the parts of a page need of the console: whether the user has left the page
// since it was drawn (a late answer is then dropped), how to show an error, the crumbs.
function pageContext() {
  const mine = generation;
  return { stale: () => mine !== generation, failed, setCrumbs };
}

function setCrumbs(...items) {
  replace(
    crumbs,
    h(
      "ol",
      {},
      items.map(([label, href]) =>
        h("li", {}, href ? h("a", { href }, label) : h("span", { "aria-current": "page" }, label)),
      ),
    ),
  );
}

// -- sign in -----------------------------------------------------------------------------

function showSignIn(message) {
  generation++;
  view = null;
  signout.hidden = true;
  failingLink.hidden = true;
  load.hidden = true;
  setCrumbs(["Sign in"]);
  // No name: a form field without one is never sent, whatever happens to the form.
  const input = h("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const note = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "signin" },
    h("h1", {}, "Sign in"),
    h(
      "p",
      { class: "muted" },
      "Paste an API token. A token with the read scope can look; cancelling and " +
        "retrying tasks, and pausing and running schedules, need the enqueue scope. " +
        "The token stays in this tab only.",
    ),
    message ? h("p", { class: "muted", role: "status" }, message) : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    note,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    session.signIn(input.value.trim());
    input.value = "";
    try {
      await call("GET", path.runtimes(), { limit: 1 });
    } catch (err) {
      session.signOut();
      replace(note, problemText(err));
      return;
    }
    route();
  });
  replace(main, form);
  input.focus();
}

// -- shared pieces -----------------------------------------------------------------------

function updated() {
  return `Updated ${new Date().toISOString().slice(11, 19)} UTC, every ${REFRESH_MS / 1000} s`;
}

// -- runtimes ----------------------------------------------------------------------------

const RUNTIME_COLUMNS = [
  ["runtime_id", "Runtime", "text"],
  ["queued", "Queued", "num"],
  ["sparkline", "Depth, last hour", "chart"],
  ["claimed", "Claimed", "num"],
  ["dead", "Dead", "num"],
  ["oldest_queued_age_seconds", "Oldest queued", "num"],
  ["parked_pollers", "Parked pollers", "num"],
  ["claims_per_minute", "Claims/min", "num"],
  ["paused", "State", "text"],
];

function showRuntimes() {
  setCrumbs(["Runtimes"]);
  const cursors = [""];
  const sort = { key: "runtime_id", descending: false };
  let rows = [];
  let next = null;
  const table = h("div", { class: "scroll" });
  const stamp = h("p", { class: "muted stamp" });
  const pages = h("div");
  const fleet = fleetPanel(pageContext());
  const jump = h("input", { id: "goto", name: "runtime", autocomplete: "off", required: true });
  const jumpForm = h(
    "form",
    { class: "inline" },
    h("label", { for: "goto" }, "Open a runtime by id"),
    jump,
    h("button", { type: "submit" }, "Open"),
  );
  jumpForm.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = `#/runtime/${encodeURIComponent(jump.value.trim())}`;
  });
  replace(
    main,
    h("h1", {}, "Runtimes"),
    h(
      "p",
      { class: "muted" },
      "Runtimes with tasks (or controls set), in id order. The column buttons sort " +
        "the runtimes of this page. ",
      h("a", { href: "#/failing" }, "Failing runtimes"),
      ": the most failed and dead tasks in the last hour.",
    ),
    fleet.el,
    jumpForm,
    stamp,
    table,
    pages,
  );

  function draw() {
    const sorted = [...rows].sort((a, b) => {
      const x = a[sort.key] ?? -1;
      const y = b[sort.key] ?? -1;
      const order = x < y ? -1 : x > y ? 1 : 0;
      return sort.descending ? -order : order;
    });
    const head = RUNTIME_COLUMNS.map(([key, label, kind]) => {
      if (kind === "chart") return h("th", { scope: "col" }, label);
      const active = sort.key === key;
      const button = h(
        "button",
        { type: "button", class: "sort" },
        label,
        active ? (sort.descending ? " ▼" : " ▲") : "",
      );
      button.addEventListener("click", () => {
        sort.descending = active ? !sort.descending : kind === "num";
        sort.key = key;
        draw();
        table.querySelector(`th[data-key="${key}"] button`).focus();
      });
      const ariaSort = active ? (sort.descending ? "descending" : "ascending") : null;
      return h("th", { scope: "col", class: kind, "data-key": key, "aria-sort": ariaSort }, button);
    });
    const body = sorted.map((r) =>
      h(
        "tr",
        {},
        h(
          "th",
          { scope: "row" },
          h("a", { href: `#/runtime/${encodeURIComponent(r.runtime_id)}` }, r.runtime_id),
        ),
        h("td", { class: "num" }, r.queued),
        h("td", { class: "spark" }, sparkline(r.sparkline || [], 3600)),
        h("td", { class: "num" }, r.claimed),
        h("td", { class: "num" }, r.dead),
        h("td", { class: "num" }, age(r.oldest_queued_age_seconds)),
        h("td", { class: "num" }, r.parked_pollers),
        h("td", { class: "num" }, r.claims_per_minute),
        h("td", {}, r.paused ? h("span", { class: "badge paused" }, "paused") : "running"),
      ),
    );
    replace(
      table,
      rows.length
        ? h("table", { id: "runtimes" }, h("thead", {}, h("tr", {}, head)), h("tbody", {}, body))
        : h("p", { class: "empty" }, "No runtime here yet: enqueue a task, or open a runtime by id."),
    );
    replace(pages, pager(cursors, next, refresh));
  }

  async function refresh() {
    const mine = generation;
    const cursor = cursors[cursors.length - 1];
    // The page's sparklines come in the same answer, read for the page at once.
    const [{ body }] = await Promise.all([
      call("GET", path.runtimes(), { limit: RUNTIMES_PER_PAGE, cursor, include: "sparkline" }),
      fleet.refresh(),
    ]);
    if (mine !== generation) return;
    rows = body.runtimes;
    next = body.next_cursor;
    replace(stamp, updated());
    draw();
  }
  return { refresh, errors: table };
}

// -- a runtime ---------------------------------------------------------------------------

function showRuntime(rt) {
  setCrumbs(["Runtimes", "#/"], [rt]);
  const cursors = [""];
  let status = "";
  let next = null;
  const counts = h("div", { class: "cards" });
  const stamp = h("p", { class: "muted stamp" });
  const list = h("div", { class: "scroll" });
  const pages = h("div");
  const filters = h("div", { class: "filters", role: "group", "aria-label": "Show tasks" });

  function drawFilters() {
    replace(
      filters,
      ["", ...STATUSES].map((s) => {
        const b = h("button", { type: "button", "aria-pressed": String(s === status) }, s || "all");
        b.addEventListener("click", async () => {
          status = s;
          cursors.splice(1);
          drawFilters();
          await refreshTasks().catch((err) => failed(err, list));
          filters.querySelector('[aria-pressed="true"]').focus();
        });
        return b;
      }),
    );
  }
  drawFilters();
  const controls = controlsPanel(rt, pageContext());
  const schedules = schedulesPanel(rt, pageContext());
  const charts = runtimeHistoryPanel(rt, pageContext());
  const failures = failuresPanel(rt, pageContext(), () => refresh());

  replace(
    main,
    h("h1", {}, h("span", { class: "muted" }, "Runtime "), rt),
    stamp,
    counts,
    h("h2", {}, "History"),
    charts.el,
    h("h2", {}, "Failures"),
    failures.el,
    h("h2", {}, "Controls"),
    controls.el,
    h("h2", {}, "Schedules"),
    schedules.el,
    h("h2", {}, "Tasks"),
    filters,
    list,
    pages,
  );

  function card(label, value, cls) {
    return h("div", { class: `card ${cls || ""}` }, h("span", { class: "value" }, value), label);
  }

  async function refreshStats() {
    const mine = generation;
    const { body } = await call("GET", path.stats(rt));
    if (mine !== generation) return;
    replace(
      counts,
      STATUSES.map((s) => card(s, body.counts[s] ?? 0, `s-${s}`)),
      card("oldest queued", age(body.oldest_queued_age_seconds)),
      card("parked pollers", body.parked_pollers),
    );
    replace(stamp, updated());
    return body.counts;
  }

  async function refreshTasks() {
    const mine = generation;
    const { body } = await call("GET", path.tasks(rt), {
      status,
      limit: TASKS_PER_PAGE,
      cursor: cursors[cursors.length - 1],
    });
    if (mine !== generation) return;
    next = body.next_cursor;
    replace(
      list,
      body.tasks.length
        ? h(
            "table",
            { id: "tasks" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                ["Task", "Status", "Priority", "Attempts", "Created", "Updated"].map((c) =>
                  h("th", { scope: "col" }, c),
                ),
              ),
            ),
            h(
              "tbody",
              {},
              body.tasks.map((t) =>
                h(
                  "tr",
                  {},
                  h(
                    "th",
                    { scope: "row" },
                    h(
                      "a",
                      { href: `#/task/${encodeURIComponent(t.id)}`, class: "mono", title: t.id },
                      // The end of the id: its start is its creation time (UUIDv7),
                      // alike for every task made in the same minute.
                      t.id.slice(-8),
                    ),
                  ),
                  h("td", {}, badge(t.status), t.cancel_requested ? " cancelling" : ""),
                  h("td", { class: "num" }, t.priority),
                  h("td", { class: "num" }, `${t.attempts} / ${t.max_attempts}`),
                  h("td", {}, time(t.created_at)),
                  h("td", {}, time(t.updated_at)),
                ),
              ),
            ),
          )
        : h("p", { class: "empty" }, status ? `No ${status} tasks here.` : "No tasks here."),
    );
    replace(pages, pager(cursors, next, () => refreshTasks().catch((err) => failed(err, list))));
  }

  async function refresh() {
    await Promise.all([
      refreshStats().then((c) => c && failures.refresh(c)),
      refreshTasks(),
      charts.refresh(),
      controls.refresh(),
      schedules.refresh(),
    ]);
  }
  return { refresh, errors: counts };
}

// -- routing -----------------------------------------------------------------------------

async function route() {
  generation++;
  if (!session.token()) return showSignIn();
  signout.hidden = false;
  failingLink.hidden = false;
  const hash = location.hash || "#/";
  const [, kind, raw] = hash.match(/^#\/(runtime|task)\/(.+)$/) || [];
  const id = raw ? decodeURIComponent(raw) : null;
  if (kind === "runtime") view = showRuntime(id);
  else if (kind === "task") view = showTask(id, main, pageContext());
  else if (hash === "#/failing") view = showFailing(main, pageContext());
  else view = showRuntimes();
  const current = view;
  refreshLoad();
  try {
    await current.refresh();
  } catch (err) {
    if (view === current) failed(err, current.errors);
  }
}

let refreshing = false;
setInterval(async () => {
  if (!view || refreshing || document.hidden) return;
  refreshing = true;
  const current = view;
  try {
    await Promise.all([current.refresh(), refreshLoad()]);
  } catch (err) {
    if (view === current) failed(err, current.errors);
  } finally {
    refreshing = false;
  }
}, REFRESH_MS);

window.addEventListener("hashchange", () => {
  route();
  main.focus({ preventScroll: true });
});
route();
