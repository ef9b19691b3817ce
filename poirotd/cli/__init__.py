"""The command line: `poirotd run | demo | check-config | audit | eval | ...`."""
