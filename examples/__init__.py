"""Runnable examples of feeding poirotd from an agent system (docs/operating/client-sdk.md); each
takes --target and --system, for a daemon started with `poirotd run --config ...`."""
