"""The shared fixtures (tests/support/fixtures.py) are a plugin, so every folder sees them."""

pytest_plugins = ["tests.support.fixtures"]
