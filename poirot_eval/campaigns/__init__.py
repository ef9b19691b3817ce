"""Fault-injection campaigns (AEGIS-style): labelled variants of clean sessions.

A campaign takes clean sessions (eval cases, or sessions from the daemon's store), injects one
fault per variant (an agent's message corrupted, what it was told altered, a hardware signal or
a market feed corrupted), keeps a variant only when the hazard it aims at fires, and writes each
kept variant as a one-case JSON file whose truth names the fault: the format `poirotd eval run
--cases`, `replay` and `export` read.
"""
