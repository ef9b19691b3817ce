"""Limits both ends of the gRPC wire agree on."""

# Replies are bounded by what the daemon stores, not by what clients send: a full investigation
# record with every prompt and answer runs to megabytes.
MAX_REPLY_BYTES = 64 << 20
# Clients pack ingest items into one request up to this size (an item larger than this goes
# alone); the server's transport limit leaves room for such a batch.
BATCH_BYTES = 64 << 10
