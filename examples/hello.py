"""A task command for `gateway work`: the payload arrives as JSON on stdin, the result
leaves as JSON on stdout. A non-zero exit fails the task with the end of stderr.

    gateway work demo -- python3 examples/hello.py
"""

import json
import os
import sys

payload = json.load(sys.stdin)
options = payload if isinstance(payload, dict) else {"name": payload}
if options.get("fail"):
    print(f"asked to fail: {options['fail']}", file=sys.stderr)
    sys.exit(3)
print(
    json.dumps(
        {
            "greeting": f"hello, {options.get('name', 'world')}",
            "task_id": os.environ.get("GATEWAY_TASK_ID"),
            "attempt": int(os.environ.get("GATEWAY_TASK_ATTEMPT", "0")),
        }
    )
)
