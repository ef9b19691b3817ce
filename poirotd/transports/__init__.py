"""Adapters that carry data in and out (gRPC, MQTT, metrics over HTTP): each calls the ingest
pipeline or the investigations service, and each starts, drains and stops the same way."""
