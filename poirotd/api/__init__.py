"""Generated protobuf/gRPC code for proto/poirot/v1 is in poirotd.api.poirot.v1 (`make proto`)."""
