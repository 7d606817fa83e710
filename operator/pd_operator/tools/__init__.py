"""Developer tools run by Makefile targets (code generators, sync steps)."""
