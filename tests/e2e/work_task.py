"""The command the `gateway work` tests run for each task. The payload says what to do:
`pidfile` (write our pid there first), `sleep` (seconds, on attempt `sleep_on_attempt`,
default every attempt), `fail` (exit 7 after 5,000 bytes of stderr and a marker)."""

import json
import os
import sys
import time

payload = json.load(sys.stdin)
attempt = int(os.environ["GATEWAY_TASK_ATTEMPT"])
if payload.get("pidfile"):
    with open(payload["pidfile"], "w") as f:
        f.write(str(os.getpid()))
if payload.get("sleep") and payload.get("sleep_on_attempt", attempt) == attempt:
    time.sleep(payload["sleep"])
if payload.get("fail"):
    sys.stderr.write("x" * 5000 + "\nfailed on purpose: " + str(payload["n"]))
    sys.exit(7)
print(
    json.dumps(
        {
            "n": payload.get("n"),
            "task_id": os.environ["GATEWAY_TASK_ID"],
            "runtime": os.environ["GATEWAY_RUNTIME"],
            "attempt": attempt,
            "token_withheld": "GATEWAY_TOKEN" not in os.environ,
            "traceparent": os.environ.get("TRACEPARENT"),
            "tracestate": os.environ.get("TRACESTATE"),
        }
    )
)
