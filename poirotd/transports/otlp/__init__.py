"""The OTLP receiver: agent frameworks' OpenTelemetry traces (GenAI or OpenInference
conventions), and the GenAI log events instrumentations send beside them, become sessions of
agent messages, through the one ingest pipeline. `mapping` reads spans, `log_records` reads log
events, `log_join` joins them to their spans across exports, `receiver` numbers and stores what
they say, `grpc_services` and `http` are its transports."""
