"""The generated Python must match proto/ exactly: a stale checkout fails here."""

from poirotd.api.codegen import stale_files


def test_generated_code_matches_proto_files() -> None:
    assert stale_files() == [], "run `make proto` and commit the result"
