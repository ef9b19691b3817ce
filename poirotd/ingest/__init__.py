"""The one ingest pipeline every transport calls: validate, evaluate rules, commit, open, count."""
