"""Run by Phoenix's own venv (.venv-phoenix), so it imports nothing of poirotd: waits until a
span of NAME is in trace TRACE_ID, as Phoenix's own client (phoenix.client) reads it, then prints
every span of the trace as JSON. Exit status 3 if none came within SECONDS.

    .venv-phoenix/bin/python tests/support/phoenix_query.py URL PROJECT TRACE_ID NAME SECONDS

It polls itself rather than being run once per poll: importing `phoenix` loads the whole server
package (over a minute on two busy cores).
"""

from __future__ import annotations

import json
import sys
import time

from phoenix.client import Client

NOT_FOUND = 3


def main() -> int:
    url, project, trace_id, name, seconds = sys.argv[1:6]
    client = Client(base_url=url)
    deadline = time.monotonic() + float(seconds)
    while True:
        spans = client.spans.get_spans(project_identifier=project, trace_ids=[trace_id])
        if any(span["name"] == name for span in spans) or time.monotonic() > deadline:
            break
        time.sleep(1)
    json.dump(list(spans), sys.stdout)
    return 0 if any(span["name"] == name for span in spans) else NOT_FOUND


if __name__ == "__main__":
    sys.exit(main())
