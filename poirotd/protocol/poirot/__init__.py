"""POIROT's own phases: the hazard space, self-assessment, interrogation (with the peer tools it
gives an analyst). What the methods share (prompts, schemas, aggregation, the engine) stays in
poirotd/protocol/."""
