// Builds DOM nodes. Text always goes in as text nodes and attributes through
// setAttribute, never as HTML: runtime ids, payloads and errors come from tenants.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// "2026-11-26T09:21:57.123456Z" -> "2026-11-26 09:21:57" (UTC, said elsewhere)
export function dateTime(iso) {
  return `${iso.slice(0, 10)} ${iso.slice(11, 19)}`;
}

// "2026-11-26T09:21:57.123456Z" -> "2026-11-26 09:21:57 UTC"
export function time(iso) {
  if (!iso) return "—";
  return `${dateTime(iso)} UTC`;
}

// Seconds -> "42 s", "3 min", "2 h 5 min", "3 d 4 h"
export function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function badge(status) {
  return h("span", { class: `badge s-${status}` }, status);
}

// Previous and Next buttons over a keyset listing. `cursors` is the stack of the pages
// shown so far (the first page's cursor is ""), `next` the cursor of the page after
// this one (null on the last), and `go()` loads the page on top of the stack.
export function pager(cursors, next, go) {
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
