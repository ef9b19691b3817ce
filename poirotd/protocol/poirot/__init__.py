"""POIROT's own phases: the hazard space, self-assessment, interrogation (with the peer tools it
gives an analyst), with its prompts and answer formats. What the methods share (the session as
chat turns, the incident, the formats' building blocks, aggregation, the engine) stays in
poirotd/protocol/."""
