"""gRPC: the Ingest and Investigations services, health and reflection, on one port."""
