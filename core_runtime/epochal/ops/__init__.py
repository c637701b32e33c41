"""Operator tools: the command line and its commands, job status, in-doubt transactions, the
demo, recovery phases."""
