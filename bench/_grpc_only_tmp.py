import asyncio, sys, tempfile, time
from pathlib import Path
import numpy as np
from bench import ingest as b
from poirotd import logs
logs.configure("warning", "json")
async def main():
    p = b.plan(True, 1)
    lat, commits = [], []
    with tempfile.TemporaryDirectory() as t, b.probes(lat, commits):
        r = await b.grpc_ingest(p, Path(t))
        raw = await b.raw_commit(b.agent_items(p), Path(t) / "raw.db")
    sizes = np.array([n for n, _ in commits]); secs = np.array([s for _, s in commits])
    print(r.per_second, r.meter.cpu_share, raw.per_second, raw.meter.cpu_share, "commits", len(commits), "median size", np.median(sizes), "median ms", np.median(secs)*1000, "sum s", secs.sum())
asyncio.run(main())
