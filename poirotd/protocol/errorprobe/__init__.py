"""ErrorProbe (Li et al.): MAST-guided anomaly tags, symptom-driven backward tracing, a
Strategist / Investigator / Arbiter diagnosis whose evidence the daemon checks against the stored
session, and a memory that learns only from verified diagnoses."""

from poirotd.protocol.errorprobe.method import attribute

__all__ = ["attribute"]
