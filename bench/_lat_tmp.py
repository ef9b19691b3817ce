import asyncio, tempfile, sys
from pathlib import Path
from bench import ingest as b
from poirotd import logs
logs.configure("warning", "json")
async def main():
    p = b.plan(True, 1)
    with tempfile.TemporaryDirectory() as t:
        (Path(t)/"a").mkdir()
        r = await b.hazard_latency(p, Path(t)/"a", b.LOAD)
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
asyncio.run(main())
