"""Each bench's section of BENCHMARKS.md as Markdown, rendered from the plain results its
measuring module (bench/NAME.py) returns: a function of them alone, so the wording can change
without measuring again and the measuring code carries no prose. A section module imports the
measuring module's types for annotations only, so the one import at run time is bench/NAME.py's
of its section."""
