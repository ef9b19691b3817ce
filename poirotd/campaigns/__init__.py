"""Labelled cases at work in the daemon: canaries (shadow investigations scored against their
label) and reputations seeded from a fault campaign's outcomes."""
