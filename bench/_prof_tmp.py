import json, timeit
from bench import ingest as b
from poirotd.store import sqlite as st
tele = b.telemetry_items(10)[3]
msg = b.agent_items(b.plan(True,1))[5]
for name, obj in (("tele", tele), ("msg", msg)):
    d = obj.model_dump(mode="json")
    n=20000
    print(name, "dump", timeit.timeit(lambda: obj.model_dump(mode="json"), number=n)/n*1e6,
      "canon", timeit.timeit(lambda: st._CANONICAL.encode(d), number=n)/n*1e6,
      "dumps default", timeit.timeit(lambda: json.dumps(d), number=n)/n*1e6,
      "dumps sort", timeit.timeit(lambda: json.dumps(d, sort_keys=True, separators=(",",":"), ensure_ascii=False), number=n)/n*1e6,
      "hash", timeit.timeit(lambda: st.entry_hash("00"*32, "telemetry", "123", st._CANONICAL.encode(d)), number=n)/n*1e6,
      "dump_json", timeit.timeit(lambda: obj.model_dump_json(), number=n)/n*1e6)
    print(d)
