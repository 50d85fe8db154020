// The load panel above every page: the answering instance's database line and what it
// refused lately (GET /v1/instance/load). One quiet line while nothing is shed; a
// banner with the rate per reason, the line and the last ten minutes while it sheds.
import { call } from "./api.js";
import { h, replace } from "./dom.js";

// What each reason of gateway_shed_total means, for someone who never saw the code.
const REASONS = {
  database_queue: "refused: the line for a database connection was full",
  busy: "refused: a claim, while this instance worked on more requests than it takes at once",
  client_gone: "dropped: the client left while its request waited",
};

function reasonText(reason) {
  return REASONS[reason] || reason;
}

function perSecond(count) {
  const rate = count / 60;
  return rate >= 10 ? `${Math.round(rate)}/s` : `${rate.toFixed(1)}/s`;
}

function total(counts) {
  return Object.values(counts).reduce((a, b) => a + b, 0);
}

function instanceText(load) {
  return `instance ${load.host} (id ${load.instance_id})`;
}

// The line's limit is how much work may wait before more is refused at once; it falls
// as Postgres slows down.
function lineText(line) {
  const used = `${line.connections_in_use} of ${line.connections} database connections in use`;
  const limit =
    line.work_limit === null ? "no limit measured yet" : `at most ${Math.floor(line.work_limit)}`;
  return `${used}; ${line.waiting_work} requests of work waiting for one (${limit})`;
}

// A row per reason, a column per minute (UTC), the current minute last.
function minutesTable(load) {
  const minutes = load.shed_per_minute;
  const reasons = [...new Set(minutes.flatMap((m) => Object.keys(m.shed)))].sort();
  return h(
    "div",
    { class: "scroll" },
    h(
      "table",
      { id: "shed-minutes" },
      h("caption", { class: "muted" }, "Requests shed per minute (UTC), the current minute last"),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", { scope: "col" }, "Reason"),
          minutes.map((m) => h("th", { scope: "col", class: "num" }, m.minute.slice(11, 16))),
        ),
      ),
      h(
        "tbody",
        {},
        reasons.map((r) =>
          h(
            "tr",
            {},
            h("th", { scope: "row" }, h("code", {}, r)),
            minutes.map((m) => h("td", { class: "num" }, m.shed[r] || 0)),
          ),
        ),
      ),
    ),
  );
}

function shedding(load) {
  const last = load.shed_last_minute;
  return [
    h("h2", {}, "This gateway is shedding load"),
    h(
      "ul",
      { class: "rates" },
      Object.keys(last)
        .sort()
        .map((reason) =>
          h(
            "li",
            {},
            h("strong", {}, perSecond(last[reason])),
            ` ${reasonText(reason)} (${last[reason]} in the last minute, `,
            h("code", {}, reason),
            ")",
          ),
        ),
    ),
    h("p", { id: "load-line" }, lineText(load.database_line)),
    h(
      "p",
      { class: "muted" },
      `Figures of the ${instanceText(load)}, the one that answered; others may differ. ` +
        "Refused clients were told to retry; completes, fails and heartbeats are never refused.",
    ),
    minutesTable(load),
  ];
}

function quiet(load) {
  const earlier = load.shed_per_minute.reduce((n, m) => n + total(m.shed), 0);
  const summary = earlier
    ? `${earlier} requests shed in the last 10 minutes, none in the last minute`
    : "nothing shed in the last 10 minutes";
  const line = h(
    "p",
    {},
    `Database: ${lineText(load.database_line)}; ${summary}. `,
    h("span", { class: "who" }, `(${instanceText(load)})`),
  );
  if (!earlier) return [line];
  return [line, h("details", {}, h("summary", {}, "Per minute"), minutesTable(load))];
}

// Refreshes `el` from the API; an instance that cannot answer (an older gateway, a
// token refused) leaves it empty rather than failing the page.
export function loadPanel(el) {
  let wasShedding = false;
  return async function refresh() {
    let load;
    try {
      load = (await call("GET", "/v1/instance/load")).body;
    } catch {
      el.hidden = true;
      replace(el);
      return;
    }
    el.hidden = false;
    el.className = load.shedding ? "load shedding" : "load quiet";
    // Announced once, when shedding starts; not at every refresh.
    if (load.shedding && !wasShedding) el.setAttribute("role", "alert");
    else el.removeAttribute("role");
    wasShedding = load.shedding;
    replace(el, load.shedding ? shedding(load) : quiet(load));
  };
}
