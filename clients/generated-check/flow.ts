/**
 * A task's life through the TypeScript types that openapi-typescript generates from the
 * gateway's OpenAPI document, called with openapi-fetch: enqueue (whole, then with
 * `Prefer: return=minimal`), claim, complete and read. `make clients-check` compiles it
 * with `tsc --strict` and runs it against a real gateway:
 *
 *     node build/flow.js GATEWAY_URL TOKEN
 *
 * It compiling is half the check: a request body without its optional fields, and a
 * claimed task's lease read without a test for undefined, are what the document must
 * allow.
 */
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Task = components["schemas"]["Task"];
type ClaimedTask = components["schemas"]["ClaimedTask"];

const [baseUrl, token] = process.argv.slice(2);
if (!baseUrl || !token) {
  console.error("usage: node build/flow.js GATEWAY_URL TOKEN");
  process.exit(2);
}

function fail(step: string, status: number, detail: unknown): never {
  console.error(`typescript client: ${step} answered ${status}: ${JSON.stringify(detail)}`);
  process.exit(1);
}

const client = createClient<paths>({
  baseUrl,
  headers: { Authorization: `Bearer ${token}` },
});
const rt = "clients-typescript";

// Only the payload: priority, max_attempts and the rest are the server's to fill in.
const enqueued = await client.POST("/v1/runtimes/{rt}/tasks", {
  params: { path: { rt } },
  body: { payload: { n: 1, text: "from TypeScript" } },
});
if (enqueued.data === undefined || enqueued.response.status !== 201) {
  fail("enqueue", enqueued.response.status, enqueued.error);
}
const whole = enqueued.data;
if (!("status" in whole)) {
  fail("enqueue (a whole task expected)", enqueued.response.status, whole);
}
const task: Task = whole;

const minimal = await client.POST("/v1/runtimes/{rt}/tasks", {
  params: { path: { rt }, header: { Prefer: "return=minimal" } },
  body: { payload: { n: 2 } },
});
if (minimal.data === undefined || "status" in minimal.data) {
  fail("enqueue with return=minimal (an id alone expected)", minimal.response.status, minimal.data);
}
const second: string = minimal.data.id;

const claimed = await client.POST("/v1/runtimes/{rt}/claim", {
  params: { path: { rt } },
  body: { worker_id: "typescript-worker", max_tasks: 2, wait_seconds: 5 },
});
if (claimed.data === undefined) {
  fail("claim", claimed.response.status, claimed.error);
}
const leased: ClaimedTask[] = claimed.data.tasks;
const ids = leased.map((t) => t.id).sort();
if (JSON.stringify(ids) !== JSON.stringify([task.id, second].sort())) {
  fail("claim (both tasks expected)", claimed.response.status, claimed.data);
}

for (const held of leased) {
  // lease_id is a string here, not string | undefined: ClaimedTask requires it.
  const done = await client.POST("/v1/tasks/{task_id}/complete", {
    params: { path: { task_id: held.id } },
    body: { lease_id: held.lease_id, result: { doubled: 2 * Number(held.attempts) } },
  });
  if (done.data === undefined || done.data.status !== "completed") {
    fail("complete", done.response.status, done.data ?? done.error);
  }
}

const read = await client.GET("/v1/tasks/{task_id}", {
  params: { path: { task_id: task.id } },
});
if (read.data === undefined) {
  fail("read", read.response.status, read.error);
}
const finished: Task = read.data;
if (finished.status !== "completed" || JSON.stringify(finished.result) !== '{"doubled":2}') {
  fail("read (completed with its result expected)", read.response.status, finished);
}
const problem = await client.GET("/v1/tasks/{task_id}", {
  params: { path: { task_id: "00000000-0000-4000-8000-000000000000" } },
});
if (problem.error === undefined || problem.error.code !== "not_found") {
  fail("read of an unknown task (a not_found problem expected)", problem.response.status, problem);
}
console.log("typescript client: enqueue, claim, complete and read: ok");
