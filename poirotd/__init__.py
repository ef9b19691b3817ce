"""poirotd: a sidecar that attributes incidents in LLM multi-agent systems (POIROT)."""

__version__ = "0.1.0"
