// A task's page: its state, payload, result or last error (numbers exactly as stored,
// see json.js), lease and timeline, and Cancel or Retry (which need `enqueue`).
import { ApiError, call, path, problemText } from "./api.js";
import { badge, h, replace, time } from "./dom.js";
import { parseExact, pretty } from "./json.js";

const FINISHED = new Set(["completed", "dead", "expired", "cancelled"]);

// Draws the page in `main`. `page` is the console's: `stale()` says the user has left
// (a late answer is dropped), `failed(err, where)` shows a refused token the console's
// way, `setCrumbs(...)` names where the page is. Answers {refresh, errors}.
export function showTask(id, main, page) {
  page.setCrumbs(["Runtimes", "#/"], ["Task"]);
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
        if (err instanceof ApiError && err.status === 401) return page.failed(err, message);
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
    const { body: t, text } = await call("GET", path.task(id));
    if (page.stale()) return;
    let exact = null;
    try {
      exact = parseExact(text);
    } catch {
      exact = null;
    }
    const show = (key) => (exact ? pretty(exact.get(key)) : JSON.stringify(t[key], null, 2));
    page.setCrumbs(["Runtimes", "#/"], [t.runtime_id, `#/runtime/${encodeURIComponent(t.runtime_id)}`], ["Task"]);
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
