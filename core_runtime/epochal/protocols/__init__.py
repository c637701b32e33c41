"""The protocols that make each contract keep its guarantee: offsets replayed, ack after the
snapshot with dedupe, two-phase commit with a decision log, key stability of idempotent writes.
Each protocol reads the keys it writes."""
