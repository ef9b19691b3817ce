"""Limits both ends of the gRPC wire agree on."""

# Replies are bounded by what the daemon stores, not by what clients send: a full investigation
# record with every prompt and answer runs to megabytes.
MAX_REPLY_BYTES = 64 << 20
