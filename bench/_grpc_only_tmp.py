import asyncio, sys, tempfile
from pathlib import Path
from bench import ingest as b
from poirotd import logs
logs.configure("warning", "json")
async def main():
    p = b.plan(True, 1)
    with tempfile.TemporaryDirectory() as t:
        r = await b.agent_ingest(p, Path(t))
    print(r)
asyncio.run(main())
