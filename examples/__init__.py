"""Runnable examples of feeding poirotd from an agent system (README, "Client SDK"); each takes
--target and --system, for a daemon started with `poirotd run --config ...`."""
