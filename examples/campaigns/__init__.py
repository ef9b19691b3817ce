"""Fault-injection campaigns over the CORTEX demo and the trading desk (docs/campaigns.md)."""
