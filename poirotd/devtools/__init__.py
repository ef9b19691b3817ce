"""What poirotd's tests, benchmarks and demo start and feed it with, in one place: child processes
on free loopback ports (`process`: a `poirotd run`, a stop that cannot hang), a throwaway Mosquitto
(`broker`) and PostgreSQL (`postgres`), the clinic spec (`clinic`), its gRPC ingest requests
(`ingest_requests`), hazard-rule inputs (`hazard_inputs`), scripted LLM answers (`answers`) and
traced agent runs for the OTLP receiver (`otlp_runs`, which needs the dev extra).

The daemon never imports it (tests/test_layout.py); what only the tests share stays in
tests/support, and bench/ imports from here, never from tests/.
"""
