// Calls the gateway's API with the bearer token kept in this tab's sessionStorage.

const KEY = "claim-gateway.console.token";

export const session = {
  token: () => sessionStorage.getItem(KEY),
  signIn: (token) => sessionStorage.setItem(KEY, token),
  signOut: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }

  // "Forbidden (403): this token lacks the 'enqueue' scope needed here"
  explain() {
    const title = this.problem.title || "Request failed";
    return `${title} (${this.status}): ${this.problem.detail || "no detail given"}`;
  }
}

// What went wrong, in words for the page: the gateway's problem, or the error itself.
export function problemText(err) {
  return err instanceof ApiError ? err.explain() : `Unexpected error: ${err.message || err}`;
}

// Answers {body, text}: the parsed JSON and its text (for exact numbers, see json.js).
// `json`, when given, is sent as the request's JSON body.
export async function call(method, path, params = {}, json = undefined) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  let res;
  try {
    const headers = { Authorization: `Bearer ${session.token()}`, Accept: "application/json" };
    if (json !== undefined) headers["Content-Type"] = "application/json";
    res = await fetch(url, {
      method,
      headers,
      body: json === undefined ? undefined : JSON.stringify(json),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (err) {
    throw new ApiError(0, { title: "Gateway unreachable", detail: String(err.message || err) });
  }
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!res.ok) {
    const problem = body && typeof body === "object" ? body : { title: res.statusText };
    throw new ApiError(res.status, problem);
  }
  return { body, text };
}

export const path = {
  runtimes: () => "/v1/runtimes",
  stats: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/stats`,
  tasks: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/tasks`,
  task: (id) => `/v1/tasks/${encodeURIComponent(id)}`,
  controls: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/controls`,
  pause: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}:pause`,
  resume: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}:resume`,
  schedules: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/schedules`,
  history: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/history`,
  fleetHistory: () => "/v1/history",
  errors: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/errors`,
  retryTasks: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/tasks:retry`,
  cancelTasks: (rt) => `/v1/runtimes/${encodeURIComponent(rt)}/tasks:cancel`,
  schedule: (rt, name) => `/v1/runtimes/${encodeURIComponent(rt)}/schedules/${encodeURIComponent(name)}`,
};
