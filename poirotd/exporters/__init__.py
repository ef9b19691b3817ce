"""What leaves the daemon for other observability tools: attributions over OTLP, as the
OpenTelemetry GenAI conventions' evaluation results in the session's own trace. `placement`
finds the trace, `evaluations` builds the span, `otlp_client` sends it, `exporter` queues and
retries without ever holding an investigation up."""
