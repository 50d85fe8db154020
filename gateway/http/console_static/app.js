// The console: runtimes, a runtime, a task. Hash routes (#/, #/runtime/ID, #/task/ID)
// so that the gateway serves one page; data comes from the public API.
import { ApiError, call, path, session } from "./api.js";
import { age, badge, h, replace, time } from "./dom.js";
import { parseExact, pretty } from "./json.js";
import { loadPanel } from "./load.js";

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
const FINISHED = new Set(["completed", "dead", "expired", "cancelled"]);

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const signout = document.getElementById("signout");
const load = document.getElementById("load");
const refreshLoad = loadPanel(load);
let view = null; // {refresh(): Promise<void>}
let generation = 0; // bumped on every navigation, so a late answer is dropped

signout.addEventListener("click", () => {
  session.signOut();
  showSignIn("Signed out.");
});

function problemText(err) {
  return err instanceof ApiError ? err.explain() : `Unexpected error: ${err.message || err}`;
}

// An error of a refresh or a page load: a refused token goes back to sign-in.
function failed(err, where) {
  if (err instanceof ApiError && err.status === 401) {
    session.signOut();
    showSignIn(`The gateway refused the token: ${err.problem.detail || "not valid"}.`);
    return;
  }
  replace(where, h("p", { class: "error", role: "alert" }, problemText(err)));
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
        "retrying need the enqueue scope. The token stays in this tab only.",
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

function pager(cursors, next, go) {
  const previous = h("button", { type: "button", disabled: cursors.length <= 1 }, "Previous page");
  const following = h("button", { type: "button", disabled: !next }, "Next page");
  previous.addEventListener("click", () => {
    cursors.pop();
    go();
  });
  following.addEventListener("click", () => {
    cursors.push(next);
    go();
  });
  return h("div", { class: "pager" }, previous, following);
}

function updated() {
  return `Updated ${new Date().toISOString().slice(11, 19)} UTC, every ${REFRESH_MS / 1000} s`;
}

// -- runtimes ----------------------------------------------------------------------------

const RUNTIME_COLUMNS = [
  ["runtime_id", "Runtime", "text"],
  ["queued", "Queued", "num"],
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
        "the runtimes of this page.",
    ),
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
    const { body } = await call("GET", path.runtimes(), {
      limit: RUNTIMES_PER_PAGE,
      cursor,
    });
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

  // The runtime's controls: pause and resume, and the limits form.
  const state = h("p", { id: "runtime-state" });
  const toggle = h("button", { type: "button", id: "pause-toggle" }, "…");
  // Sent with a pause only; shown to everyone who opens the runtime while it is paused.
  const reasonLabel = h("label", { for: "pause-reason" }, "Reason for pausing (optional)");
  const reason = h("input", {
    id: "pause-reason",
    name: "reason",
    maxlength: "500",
    autocomplete: "off",
    placeholder: "e.g. database maintenance",
  });
  const controlsMessage = h("div", { class: "message" });
  const maxInFlight = h("input", {
    id: "max-in-flight",
    name: "max_in_flight",
    type: "number",
    min: "1",
    max: "100000",
    step: "1",
    placeholder: "no limit",
  });
  const perSecond = h("input", {
    id: "claims-per-second",
    name: "claims_per_second",
    type: "number",
    min: "0.001",
    max: "100000",
    step: "any",
    placeholder: "no limit",
  });
  const limits = h(
    "form",
    { class: "inline limits" },
    h("label", { for: "max-in-flight" }, "Max in flight"),
    maxInFlight,
    h("label", { for: "claims-per-second" }, "Claims per second"),
    perSecond,
    h("button", { type: "submit" }, "Save limits"),
  );
  let controls = null;

  function sayControls(text, kind) {
    replace(
      controlsMessage,
      h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text),
    );
  }

  function limitText(c) {
    const parts = [];
    if (c.max_in_flight !== null) parts.push(`at most ${c.max_in_flight} in flight`);
    if (c.claims_per_second !== null) parts.push(`at most ${c.claims_per_second} claims per second`);
    return parts.length ? parts.join(", ") : "no limits";
  }

  function drawControls(c, fillForm) {
    controls = c;
    replace(
      state,
      c.paused ? h("span", { class: "badge paused" }, "paused") : h("span", { class: "badge running" }, "running"),
      ` — ${limitText(c)}. `,
      c.paused ? "Claims hand out nothing; enqueues still work." : "",
      c.paused && c.paused_reason
        ? h("span", { id: "pause-reason-shown", class: "reason" }, ` Reason: ${c.paused_reason}.`)
        : "",
      c.paused && c.paused_since ? ` Paused since ${c.paused_since.slice(0, 19).replace("T", " ")} UTC.` : "",
      c.paused && c.paused_until
        ? ` Resumes by itself at ${c.paused_until.slice(0, 19).replace("T", " ")} UTC.`
        : "",
    );
    replace(toggle, c.paused ? "Resume runtime" : "Pause runtime");
    reasonLabel.hidden = reason.hidden = c.paused;
    if (fillForm) {
      maxInFlight.value = c.max_in_flight ?? "";
      perSecond.value = c.claims_per_second ?? "";
    }
  }

  async function change(method, where, body, done) {
    try {
      const { body: c } = await call(method, where, {}, body);
      drawControls(c, true);
      sayControls(done, "ok");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return failed(err, controlsMessage);
      const why = err instanceof ApiError && err.status === 403 ? "Not allowed. " : "";
      sayControls(`Refused. ${why}${problemText(err)}`, "error");
    }
  }

  toggle.addEventListener("click", async () => {
    if (!controls) return;
    toggle.disabled = true;
    const pausing = !controls.paused;
    const why = reason.value.trim();
    await change(
      "POST",
      pausing ? path.pause(rt) : path.resume(rt),
      pausing && why ? { reason: why } : undefined,
      pausing ? "Paused: claims hand out nothing until it is resumed." : "Resumed.",
    );
    toggle.disabled = false;
    toggle.focus();
  });
  limits.addEventListener("submit", async (event) => {
    event.preventDefault();
    const number = (input) => (input.value.trim() === "" ? null : Number(input.value));
    await change(
      "PATCH",
      path.controls(rt),
      { max_in_flight: number(maxInFlight), claims_per_second: number(perSecond) },
      "Limits saved.",
    );
  });

  replace(
    main,
    h("h1", {}, h("span", { class: "muted" }, "Runtime "), rt),
    stamp,
    counts,
    h("h2", {}, "Controls"),
    h(
      "div",
      { class: "controls" },
      state,
      h("div", { class: "inline" }, reasonLabel, reason, toggle),
      limits,
      controlsMessage,
    ),
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

  async function refreshControls() {
    const mine = generation;
    const { body } = await call("GET", path.controls(rt));
    if (mine !== generation) return;
    // The form is filled once; later refreshes leave what the user is typing alone.
    drawControls(body, controls === null);
  }

  async function refresh() {
    await Promise.all([refreshStats(), refreshTasks(), refreshControls()]);
  }
  return { refresh, errors: counts };
}

// -- a task ------------------------------------------------------------------------------

function showTask(id) {
  setCrumbs(["Runtimes", "#/"], ["Task"]);
  const head = h("div", { class: "taskhead" });
  const actions = h("div", { class: "actions" });
  const message = h("div", { class: "message" });
  const details = h("div");
  replace(main, head, actions, message, details);
  let shown = null;

  function say(text, kind) {
    replace(message, h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text));
  }

  function action(label, verb, done) {
    const b = h("button", { type: "button", class: verb === "cancel" ? "danger" : "" }, label);
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        const { body } = await call("POST", `${path.task(id)}/${verb}`);
        say(`${done} It is now ${body.status}${body.cancel_requested ? " (cancel requested)" : ""}.`, "ok");
        await refresh();
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) return failed(err, message);
        const why = err instanceof ApiError && err.status === 403 ? "Not allowed. " : "";
        say(`${label} refused. ${why}${problemText(err)}`, "error");
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }

  function drawActions(t) {
    const buttons = [];
    if ((t.status === "queued" || t.status === "claimed") && !t.cancel_requested) {
      buttons.push(action("Cancel task", "cancel", "Cancelled."));
    }
    if (t.status === "dead" || t.status === "expired" || t.status === "cancelled") {
      buttons.push(action("Retry task", "retry", "Queued again."));
    }
    const focused = actions.contains(document.activeElement) ? document.activeElement.textContent : null;
    replace(actions, buttons);
    const again = [...actions.querySelectorAll("button")].find((b) => b.textContent === focused);
    if (again) again.focus();
  }

  function field(label, ...value) {
    return [h("dt", {}, label), h("dd", {}, ...value)];
  }

  function json(label, value, cls) {
    return h("section", {}, h("h2", {}, label), h("pre", { class: cls || "json", tabindex: "0" }, value));
  }

  async function refresh() {
    const mine = generation;
    const { body: t, text } = await call("GET", path.task(id));
    if (mine !== generation) return;
    let exact = null;
    try {
      exact = parseExact(text);
    } catch {
      exact = null;
    }
    const show = (key) => (exact ? pretty(exact.get(key)) : JSON.stringify(t[key], null, 2));
    setCrumbs(["Runtimes", "#/"], [t.runtime_id, `#/runtime/${encodeURIComponent(t.runtime_id)}`], ["Task"]);
    replace(
      head,
      h("h1", {}, "Task ", h("span", { class: "mono" }, t.id)),
      h("p", {}, badge(t.status), t.cancel_requested ? h("span", { class: "note" }, " cancel requested") : ""),
    );
    if (shown !== `${t.status}/${t.cancel_requested}`) drawActions(t);
    shown = `${t.status}/${t.cancel_requested}`;
    const finished = FINISHED.has(t.status) ? t.updated_at : null;
    replace(
      details,
      h(
        "dl",
        { class: "facts" },
        field("Runtime", h("a", { href: `#/runtime/${encodeURIComponent(t.runtime_id)}` }, t.runtime_id)),
        field("Priority", t.priority),
        field("Attempts", `${t.attempts} of ${t.max_attempts}`),
        t.status === "claimed"
          ? [
              field("Worker", t.worker_id),
              field("Lease expires", time(t.lease_expires_at)),
            ]
          : field("Lease", "none"),
      ),
      h("h2", {}, "Timeline"),
      h(
        "ol",
        { class: "timeline" },
        h("li", {}, h("span", {}, "Created"), time(t.created_at)),
        h("li", {}, h("span", {}, "Run at"), time(t.run_at)),
        t.expires_at ? h("li", {}, h("span", {}, "Expires"), time(t.expires_at)) : null,
        h("li", {}, h("span", {}, "Updated"), time(t.updated_at)),
        finished ? h("li", {}, h("span", {}, "Finished"), time(finished)) : null,
      ),
      t.render_error ? h("p", { class: "error" }, t.render_error) : null,
      json("Payload", show("payload")),
      t.status === "completed" ? json("Result", show("result")) : null,
      t.last_error ? json("Last error", t.last_error, "errortext") : null,
    );
  }
  return { refresh, errors: details };
}

// -- routing -----------------------------------------------------------------------------

async function route() {
  generation++;
  if (!session.token()) return showSignIn();
  signout.hidden = false;
  const hash = location.hash || "#/";
  const [, kind, raw] = hash.match(/^#\/(runtime|task)\/(.+)$/) || [];
  const id = raw ? decodeURIComponent(raw) : null;
  view = kind === "runtime" ? showRuntime(id) : kind === "task" ? showTask(id) : showRuntimes();
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
