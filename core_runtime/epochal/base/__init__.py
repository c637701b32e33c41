"""What every layer of the runtime uses and that knows nothing of jobs: owner-only files,
processes and run tokens, secrets in options, the fault plan of a test."""
