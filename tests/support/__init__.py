"""What the tests and bench/ share, so that no test module imports another.

`daemon` (an in-process daemon and its client), `spec` (the clinic the API tests monitor),
`ingest` (gRPC requests a producer sends), `answers` (scripted LLM answers), `protocol` (a
scripted world for the engine), `mosquitto` (a real broker), `waiting`, `hazards`, `store`,
`cli`, `data`, `deploy`. The pytest fixtures over them are in `fixtures`, registered as a plugin
by tests/conftest.py.
"""
