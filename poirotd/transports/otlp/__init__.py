"""The OTLP trace receiver: agent frameworks' OpenTelemetry traces (GenAI or OpenInference
conventions) become sessions of agent messages, through the one ingest pipeline. `mapping` reads
spans, `receiver` numbers and stores what they say, `trace_service` and `http` are its doors."""
