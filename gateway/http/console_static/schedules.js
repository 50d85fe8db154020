// A runtime's schedules on its page (GET /v1/runtimes/{rt}/schedules, 20 a page, in
// name order): when each runs, its next ticks, its last tick and the task it made, and
// whether it is paused, with its note. Pause (with an optional note), Resume and Run
// now (…:pause, …:resume, …:trigger) need the `enqueue` scope on the runtime; a
// refusal is shown in the panel and the page goes on.
import { ApiError, call, path, problemText } from "./api.js";
import { age, badge, dateTime, h, pager, replace, time } from "./dom.js";

const SCHEDULES_PER_PAGE = 20;

// What each overlap policy does, for someone who never read the guide.
const OVERLAP = {
  skip: "a tick is skipped while the schedule's previous task is queued or running",
  allow: "every tick enqueues a task, whatever became of the previous one",
  buffer_one: "one task may wait queued behind a running one; further ticks are skipped",
  cancel_previous: "a tick cancels the previous task if it is still queued or running",
};

// One formatter per zone: building one is the slow part. "sv-SE" writes dates as
// ISO does ("2026-11-28 03:00:00").
const formats = new Map();

// An instant ("2026-11-28T02:00:00.000000Z") on the wall clock of `zone`, or null when
// this browser does not know the zone.
function wall(iso, zone) {
  if (!formats.has(zone)) {
    let format = null;
    try {
      format = new Intl.DateTimeFormat("sv-SE", {
        timeZone: zone,
        year: "numeric",
        month: "2-digit",
        day: "2-digit",
        hour: "2-digit",
        minute: "2-digit",
        second: "2-digit",
        hourCycle: "h23",
      });
    } catch {
      format = null; // a zone the gateway knows and this browser does not
    }
    formats.set(zone, format);
  }
  const format = formats.get(zone);
  // Milliseconds only: Date reads three digits of a fraction, the API writes six.
  return format ? format.format(new Date(`${iso.slice(0, 23)}Z`)) : null;
}

// A tick in UTC, and under it on the schedule's own clock when that is not UTC.
function tick(iso, zone) {
  const local = zone === "UTC" ? null : wall(iso, zone);
  return [dateTime(iso), local ? h("span", { class: "zone" }, `${local} ${zone}`) : null];
}

// A cron is read on the clock of its zone; an interval ticks in UTC, whatever its zone.
function runs(s) {
  if (s.cron !== null) return [h("code", {}, s.cron), h("span", { class: "zone" }, `in ${s.timezone}`)];
  const n = s.every_seconds;
  return n >= 60 ? `every ${n} s (${age(n)})` : `every ${n} s`;
}

function nextRun(s) {
  if (s.paused) return h("span", { class: "muted" }, "none while paused");
  if (!s.next_run_at) return "—";
  return [
    tick(s.next_run_at, s.timezone),
    s.upcoming.length > 1
      ? h(
          "details",
          { "data-name": s.name },
          h("summary", {}, `Next ${s.upcoming.length}`),
          h(
            "ol",
            { class: "upcoming" },
            s.upcoming.map((t) => h("li", {}, tick(t, s.timezone))),
          ),
        )
      : null,
  ];
}

function taskLink(id) {
  // The end of the id, as in the tasks list: its start is its creation time (UUIDv7).
  return h("a", { href: `#/task/${encodeURIComponent(id)}`, class: "mono", title: id }, id.slice(-8));
}

// The last tick decided, and the task the schedule made last (a skipped tick made none).
function lastTick(s) {
  const when = s.last_tick_at ? dateTime(s.last_tick_at) : h("span", { class: "muted" }, "never");
  if (!s.last_task_id) return when;
  return [
    when,
    h(
      "span",
      { class: "last-task" },
      "task ",
      taskLink(s.last_task_id),
      " ",
      // The task is gone once retention removed it; its id stays on the schedule.
      s.last_task_status ? badge(s.last_task_status) : h("span", { class: "muted" }, "no longer stored"),
    ),
  ];
}

function state(s) {
  return [
    h("span", { class: `badge ${s.paused ? "paused" : "running"}` }, s.paused ? "paused" : "active"),
    s.note ? h("span", { class: "schedule-note" }, "Note: ", s.note) : null,
  ];
}

// `page.stale()` says the user has left the page (a late answer is then dropped);
// `page.failed(err, where)` shows a refusal of the token (401) the console's way.
// Answers {el, refresh}: the panel, and what reloads its page of schedules.
export function schedulesPanel(rt, page) {
  const cursors = [""];
  let rows = [];
  let next = null;
  let acting = null; // the `data-focus` of the button whose action is under way
  let changes = 0; // rows redrawn from an action's answer, so far
  const noteLabel = h("label", { for: "schedule-note" }, "Note for a pause (optional)");
  const note = h("input", {
    id: "schedule-note",
    name: "note",
    maxlength: "500",
    autocomplete: "off",
    placeholder: "e.g. waiting for the new image",
  });
  const noteLine = h("div", { class: "inline", hidden: true }, noteLabel, note);
  const message = h("div", { class: "message" });
  const list = h("div", { class: "scroll" }, h("p", { class: "muted empty" }, "Loading…"));
  const pages = h("div");

  function say(kind, ...parts) {
    replace(message, h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, parts));
  }

  // POST …/schedules/{name}:{op}, then `done(answer)`; a refusal is said in the panel.
  async function act(button, s, op, body, done) {
    button.disabled = true;
    acting = button.dataset.focus;
    try {
      const { body: answer } = await call("POST", `${path.schedule(rt, s.name)}:${op}`, {}, body);
      await done(answer);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return page.failed(err, message);
      const why = err instanceof ApiError && err.status === 403 ? "Not allowed. " : "";
      const verb = op === "trigger" ? "run" : op;
      say("error", `Could not ${verb} ${s.name}. ${why}${problemText(err)}`);
    } finally {
      acting = null;
      button.disabled = false;
      // A disabled button loses the focus; give it back unless the user moved on.
      if (button.isConnected && document.activeElement === document.body) button.focus();
    }
  }

  // The row of a schedule whose answer came back from an action, redrawn at once.
  function update(s) {
    changes++;
    rows = rows.map((r) => (r.name === s.name ? s : r));
    draw();
  }

  // A row's button, named for screen readers with its schedule's name; `data-focus`
  // finds it again after a redraw (":" is not a letter of a name).
  function button(s, key, text, label) {
    return h("button", { type: "button", "aria-label": label, "data-focus": `${key}:${s.name}` }, text);
  }

  function toggle(s) {
    const verb = s.paused ? "Resume" : "Pause";
    const b = button(s, "toggle", verb, `${verb} schedule ${s.name}`);
    b.addEventListener("click", () => {
      if (s.paused) {
        return act(b, s, "resume", undefined, (r) => {
          update(r);
          const when = r.next_run_at ? time(r.next_run_at) : "not known yet";
          say("ok", `Resumed ${r.name}: its next run is ${when}.`);
        });
      }
      const why = note.value.trim();
      return act(b, s, "pause", why ? { note: why } : undefined, (r) => {
        note.value = "";
        update(r);
        say("ok", `Paused ${r.name}: it makes no task until it is resumed.`);
      });
    });
    return b;
  }

  function runNow(s) {
    const b = button(s, "run", "Run now", `Run schedule ${s.name} now`);
    b.addEventListener("click", () =>
      act(b, s, "trigger", undefined, async (decided) => {
        if (decided.outcome === "enqueued") {
          say("ok", `Ran ${s.name} now: task `, taskLink(decided.task_id), " enqueued.");
        } else if (decided.outcome === "skipped_overlap") {
          const policy = `overlap: ${s.overlap}`;
          say("ok", `${s.name} did not run: its previous task is still queued or running (${policy}).`);
        } else {
          say("ok", `${s.name}: the tick was recorded as ${decided.outcome}.`);
        }
        // The row's last tick and task, read again; should that fail, the next refresh
        // reads them.
        const fresh = await call("GET", path.schedule(rt, s.name)).catch(() => null);
        if (fresh && !page.stale()) update(fresh.body);
      }),
    );
    return b;
  }

  function row(s) {
    return h(
      "tr",
      {},
      h("th", { scope: "row" }, s.name),
      h("td", {}, runs(s)),
      h("td", { title: OVERLAP[s.overlap] || null }, s.overlap),
      h("td", {}, nextRun(s)),
      h("td", {}, lastTick(s)),
      h("td", { class: "state" }, state(s)),
      h("td", {}, h("div", { class: "row-actions" }, toggle(s), runNow(s))),
    );
  }

  function table() {
    const heads = ["Schedule", "Runs", "Overlap", "Next run (UTC)", "Last tick (UTC)", "State"];
    return h(
      "table",
      { id: "schedules" },
      h("thead", {}, h("tr", {}, [...heads, "Actions"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map(row)),
    );
  }

  // Redrawn every refresh: the focused button and the opened lists of next ticks are
  // found again by the schedule's name (compared as data, never put in a selector). The
  // button of an action under way has lost the focus by being disabled, and gets it back.
  function draw() {
    const active = document.activeElement;
    let focused = list.contains(active) ? active.dataset.focus : null;
    if (acting && (!active || active === document.body)) focused = acting;
    const open = new Set([...list.querySelectorAll("details[open]")].map((d) => d.dataset.name));
    noteLine.hidden = rows.length === 0;
    const empty = cursors.length > 1 ? "No schedules on this page." : "This runtime has no schedules.";
    replace(list, rows.length ? table() : h("p", { class: "empty" }, empty));
    for (const d of list.querySelectorAll("details")) d.open = open.has(d.dataset.name);
    const again = focused && [...list.querySelectorAll("button")].find((b) => b.dataset.focus === focused);
    if (again) again.focus();
    const turn = () => refresh().catch((err) => page.failed(err, list));
    replace(pages, next || cursors.length > 1 ? pager(cursors, next, turn) : null);
  }

  async function refresh() {
    const before = changes;
    let body;
    try {
      ({ body } = await call("GET", path.schedules(rt), {
        limit: SCHEDULES_PER_PAGE,
        cursor: cursors[cursors.length - 1],
      }));
    } catch (err) {
      if (page.stale()) return;
      if (err instanceof ApiError && err.status === 401) throw err;
      // The rest of the page goes on without this panel.
      const why = `The schedules could not be read. ${problemText(err)}`;
      replace(list, h("p", { class: "error", role: "alert" }, why));
      return;
    }
    // A list read before an action's answer came back would undo its row until the next
    // refresh: the next refresh reads it again.
    if (page.stale() || before !== changes) return;
    rows = body.schedules;
    next = body.next_cursor;
    draw();
  }

  const el = h("div", { class: "schedules" }, noteLine, message, list, pages);
  return { el, refresh };
}
