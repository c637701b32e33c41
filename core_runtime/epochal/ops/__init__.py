"""Operator tools: the command line, job status, in-doubt transactions, metrics, the demo."""
