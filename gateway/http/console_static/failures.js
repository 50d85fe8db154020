// Failures first: a runtime's dead tasks grouped by error line (GET …/errors), the bulk
// actions (POST …/tasks:retry, …/tasks:cancel, which need the `enqueue` scope) behind a
// confirmation that states the count, and the failing view (#/failing): the runtimes
// with the most failed and dead tasks in the last hour (GET /v1/history), each with its
// error groups. Error lines and runtime ids are the tenants' text: shown as text only.
import { ApiError, call, path, problemText } from "./api.js";
import { append, dateTime, h, replace } from "./dom.js";

const GROUPS = 5;
const PER_CALL = 1000; // the bulk endpoints' largest (and default) limit

function tasks(n) {
  return `${n} ${n === 1 ? "task" : "tasks"}`;
}

// The bulk actions a panel offers. `count` is what the confirmation states: the tasks
// that match as the page last read them (a call takes at most PER_CALL).
const ACTIONS = {
  retryDead: (rt, count) => ({
    question: `Retry the ${count} dead ${count === 1 ? "task" : "tasks"} of ${rt}?`,
    button: `Retry ${tasks(count)}`,
    where: path.retryTasks(rt),
    body: { status: "dead" },
  }),
  retryGroup: (rt, count, line) => ({
    question:
      `Retry the ${tasks(count)} of ${rt} that ended dead with the error “${line}” ` +
      "(and any whose error starts with it)?",
    button: `Retry ${tasks(count)}`,
    where: path.retryTasks(rt),
    body: { status: "dead", error_prefix: line },
  }),
  cancelQueued: (rt, count) => ({
    question: `Cancel the ${tasks(count)} queued in ${rt}? They end cancelled and are never run.`,
    button: `Cancel ${tasks(count)}`,
    where: path.cancelTasks(rt),
    body: { status: "queued" },
    danger: true,
  }),
};

function outcomeText(answer) {
  const retrying = "retried" in answer;
  const done = retrying
    ? `Retried ${tasks(answer.retried)}: queued again.`
    : `Cancelled ${tasks(answer.cancelled)}.`;
  if (!answer.more) return done;
  return (
    `${done} More ${retrying ? "dead" : "queued"} tasks are left (a call takes at most ` +
    `${PER_CALL}, and skips those another request holds at that instant).`
  );
}

// A runtime's error groups and bulk actions. `page` as elsewhere (stale, failed);
// `changed()` is called after an action, to read the page again. Answers {el, refresh}:
// refresh(counts) takes the runtime's counts per status (GET …/stats' `counts`).
export function failuresPanel(rt, page, changed) {
  const summary = h("div", { class: "inline bulk-buttons" });
  const groups = h("div", { class: "scroll" });
  const confirm = h("div", {
    class: "confirm",
    role: "group",
    "aria-label": `Confirm a bulk action on ${rt}`,
    hidden: true,
  });
  const message = h("div", { class: "message" });

  function say(text, kind, ...extra) {
    const role = kind === "error" ? "alert" : "status";
    replace(message, h("p", { class: kind, role, tabindex: "-1" }, text, ...extra));
  }

  async function run(action) {
    replace(confirm);
    confirm.hidden = true;
    say("Working…", "muted");
    let answer;
    try {
      answer = (await call("POST", action.where, {}, action.body)).body;
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return page.failed(err, message);
      const why = err instanceof ApiError && err.status === 403 ? "Not allowed. " : "";
      return say(`Refused. ${why}${problemText(err)}`, "error");
    }
    const again = answer.more ? h("button", { type: "button", class: "again" }, "Run it again") : null;
    if (again) again.addEventListener("click", () => run(action));
    say(outcomeText(answer), "ok", again ? " " : "", again);
    // The confirmation that had the focus is gone: the outcome takes it.
    (again || message.querySelector("p")).focus();
    await changed();
  }

  function ask(action, from) {
    const yes = h("button", { type: "button", class: action.danger ? "danger" : "" }, action.button);
    const no = h("button", { type: "button", class: "plain" }, "Keep them");
    yes.addEventListener("click", () => run(action));
    no.addEventListener("click", () => {
      replace(confirm);
      confirm.hidden = true;
      if (from.isConnected) from.focus();
    });
    replace(confirm, h("p", {}, action.question), h("div", { class: "inline" }, yes, no));
    confirm.hidden = false;
    yes.focus();
  }

  function button(label, action) {
    const b = h("button", { type: "button" }, label);
    b.addEventListener("click", () => ask(action(), b));
    return b;
  }

  let dead = 0;
  let queued = 0;
  const retryAll = button("Retry all dead", () => ACTIONS.retryDead(rt, dead));
  const cancelAll = button("Cancel all queued", () => ACTIONS.cancelQueued(rt, queued));
  append(summary, [retryAll, cancelAll]);

  function drawGroups(answer) {
    if (!answer.groups.length) {
      replace(groups, h("p", { class: "empty" }, "No dead task with an error here."));
      return;
    }
    // Redrawn at every refresh: a row's button that had the focus gets it back.
    const focused = groups.contains(document.activeElement)
      ? document.activeElement.closest("tr")?.rowIndex
      : undefined;
    const head = ["Error (first line)", "Tasks", "Last ended (UTC)", "Example", "Action"];
    const table = h(
      "table",
      { class: "groups" },
      h(
        "caption",
        { class: "muted" },
        `The most common last errors of ${rt}'s dead tasks` +
          (answer.truncated ? ` (among its ${answer.tasks_read} newest dead tasks)` : ""),
      ),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          head.map((c, i) => h("th", { scope: "col", class: i === 1 ? "num" : null }, c)),
        ),
      ),
      h(
        "tbody",
        {},
        answer.groups.map((g) =>
          h(
            "tr",
            {},
            h("th", { scope: "row", class: "error-line" }, h("code", {}, g.error)),
            h("td", { class: "num" }, g.count),
            h("td", {}, dateTime(g.last_at)),
            h(
              "td",
              {},
              h(
                "a",
                {
                  href: `#/task/${encodeURIComponent(g.example_task_id)}`,
                  class: "mono",
                  title: g.example_task_id,
                },
                g.example_task_id.slice(-8),
              ),
            ),
            h(
              "td",
              {},
              button(`Retry these ${g.count}`, () => ACTIONS.retryGroup(rt, g.count, g.error)),
            ),
          ),
        ),
      ),
    );
    replace(groups, table);
    if (focused !== undefined) table.rows[focused]?.querySelector("a, button")?.focus();
  }

  async function refresh(counts) {
    const { body } = await call("GET", path.errors(rt), { limit: GROUPS });
    if (page.stale()) return;
    dead = counts.dead ?? 0;
    queued = counts.queued ?? 0;
    replace(retryAll, `Retry all ${dead} dead`);
    retryAll.disabled = dead === 0;
    replace(cancelAll, `Cancel all ${queued} queued`);
    cancelAll.disabled = queued === 0;
    drawGroups(body);
  }

  const el = h("div", { class: "failures" }, summary, confirm, message, groups);
  return { el, refresh };
}

// -- the failing view --------------------------------------------------------------------

// #/failing: the runtimes with the most failed and dead tasks in the last hour, most
// first, each with its error groups and bulk actions. `main` is the page's element.
export function showFailing(main, page) {
  page.setCrumbs(["Runtimes", "#/"], ["Failing"]);
  const stamp = h("p", { class: "muted stamp" });
  const list = h("div", { class: "failing" });
  const panels = new Map(); // runtime id -> {head, section, reload}
  replace(
    main,
    h("h1", {}, "Failing runtimes"),
    h(
      "p",
      { class: "muted" },
      "The runtimes with the most failed and dead tasks in the last hour, most first (at most 10), " +
        "each with the most common errors of its dead tasks. Failed: a claimed task that went back to " +
        "the queue for another attempt; dead: one that will not be tried again.",
    ),
    stamp,
    list,
  );

  async function refresh() {
    const { body } = await call("GET", path.fleetHistory(), { window: "1h" });
    if (page.stale()) return;
    const top = body.top_by_failures.filter((r) => r.failed + r.dead > 0);
    const sections = top.map((r) => {
      let panel = panels.get(r.runtime_id);
      if (!panel) {
        const head = h("p", { class: "muted" });
        const { el, refresh: reload } = failuresPanel(r.runtime_id, page, refresh);
        const section = h(
          "section",
          { class: "failing-runtime", "data-runtime": r.runtime_id },
          h("h2", {}, h("a", { href: `#/runtime/${encodeURIComponent(r.runtime_id)}` }, r.runtime_id)),
          head,
          el,
        );
        panel = { head, section, reload };
        panels.set(r.runtime_id, panel);
      }
      replace(panel.head, `${r.failed} failed and ${r.dead} dead in the last hour.`);
      return panel.section;
    });
    const stats = await Promise.all(top.map((r) => call("GET", path.stats(r.runtime_id))));
    if (page.stale()) return;
    await Promise.all(top.map((r, i) => panels.get(r.runtime_id).reload(stats[i].body.counts)));
    if (page.stale()) return;
    // The sections are kept, and put back only when their order changed: moving an
    // element would take the focus from a confirmation being answered.
    const same =
      sections.length === list.children.length && sections.every((s, i) => list.children[i] === s);
    if (!same) {
      replace(
        list,
        sections.length ? sections : h("p", { class: "empty" }, "No task failed or died in the last hour."),
      );
    }
    replace(stamp, `Updated ${new Date().toISOString().slice(11, 19)} UTC`);
  }
  return { refresh, errors: list };
}
