// A runtime's controls on its page: its state (running or paused, with the pause's
// reason and end), Pause/Resume and the limits form (GET/PATCH …/controls,
// POST …:pause and …:resume, which need the `control` scope).
import { ApiError, call, path, problemText } from "./api.js";
import { dateTime, h, replace } from "./dom.js";

function limitText(c) {
  const parts = [];
  if (c.max_in_flight !== null) parts.push(`at most ${c.max_in_flight} in flight`);
  if (c.claims_per_second !== null) parts.push(`at most ${c.claims_per_second} claims per second`);
  return parts.length ? parts.join(", ") : "no limits";
}

// `page.stale()` says the user has left the page (a late answer is then dropped);
// `page.failed(err, where)` shows a refusal of the token (401) the console's way.
// Answers {el, refresh}: the panel, and what reloads it from the API.
export function controlsPanel(rt, page) {
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
  const message = h("div", { class: "message" });
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

  function say(text, kind) {
    replace(message, h("p", { class: kind, role: kind === "error" ? "alert" : "status" }, text));
  }

  function draw(c, fillForm) {
    controls = c;
    replace(
      state,
      c.paused ? h("span", { class: "badge paused" }, "paused") : h("span", { class: "badge running" }, "running"),
      ` — ${limitText(c)}. `,
      c.paused ? "Claims hand out nothing; enqueues still work." : "",
      c.paused && c.paused_reason
        ? h("span", { id: "pause-reason-shown", class: "reason" }, ` Reason: ${c.paused_reason}.`)
        : "",
      c.paused && c.paused_since ? ` Paused since ${dateTime(c.paused_since)} UTC.` : "",
      c.paused && c.paused_until ? ` Resumes by itself at ${dateTime(c.paused_until)} UTC.` : "",
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
      draw(c, true);
      say(done, "ok");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return page.failed(err, message);
      const why = err instanceof ApiError && err.status === 403 ? "Not allowed. " : "";
      say(`Refused. ${why}${problemText(err)}`, "error");
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

  async function refresh() {
    const { body } = await call("GET", path.controls(rt));
    if (page.stale()) return;
    // The form is filled once; later refreshes leave what the user is typing alone.
    draw(body, controls === null);
  }

  const el = h(
    "div",
    { class: "controls" },
    state,
    h("div", { class: "inline" }, reasonLabel, reason, toggle),
    limits,
    message,
  );
  return { el, refresh };
}
