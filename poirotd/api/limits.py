"""Limits both ends of the gRPC wire agree on."""

from collections.abc import Mapping

# Replies are bounded by what the daemon stores, not by what clients send: a full investigation
# record with every prompt and answer runs to megabytes.
MAX_REPLY_BYTES = 64 << 20
# Clients pack ingest items into one request up to this size (an item larger than this goes
# alone); the server's transport limit leaves room for such a batch.
BATCH_BYTES = 64 << 10

# The largest request each method with a small request takes, in bytes as it arrives: a larger
# one is refused (RESOURCE_EXHAUSTED) before it is decoded, so that what the daemon spends on a
# refused request is bounded by what the method needs, not by the transport's limit (sized for
# ingest batches, megabytes). Ids, page tokens, filters and health's service names take a few
# hundred bytes; a Trigger reason or a ConfirmOutcome note at most 4,000 characters
# (investigations.service.MAX_TEXT_CHARS), 16,000 bytes of UTF-8, and a ConfirmOutcome names
# hazard regions besides. A SeedReputation carries a whole campaign's outcomes: some 20,000 of a
# system of 7 regions and 3 agents in 4 MiB (which the transport's default limit also allows).
# Ingest and OTLP's Export keep the transport's limit.
QUERY_REQUEST_BYTES = 4 << 10
TEXT_REQUEST_BYTES = 64 << 10
SEED_REQUEST_BYTES = 4 << 20
MAX_REQUEST_BYTES: Mapping[str, int] = {
    "/poirot.v1.Investigations/Trigger": TEXT_REQUEST_BYTES,
    "/poirot.v1.Investigations/ConfirmOutcome": TEXT_REQUEST_BYTES,
    "/poirot.v1.Investigations/Get": QUERY_REQUEST_BYTES,
    "/poirot.v1.Investigations/List": QUERY_REQUEST_BYTES,
    "/poirot.v1.Investigations/Watch": QUERY_REQUEST_BYTES,
    "/poirot.v1.Investigations/GetHazardSpace": QUERY_REQUEST_BYTES,
    "/poirot.v1.Investigations/GetReputation": QUERY_REQUEST_BYTES,
    "/poirot.v1.Investigations/SeedReputation": SEED_REQUEST_BYTES,
    "/grpc.health.v1.Health/Check": QUERY_REQUEST_BYTES,
    "/grpc.health.v1.Health/Watch": QUERY_REQUEST_BYTES,
}
