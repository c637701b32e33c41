"""The job's lease, in one place: its record (:mod:`.record`), how its holders take, advance,
renew and release it and the rules of a take-over (:mod:`.swaps`), the fence a run checks before
it acts (:mod:`.fence`), and how a session driver holds it through its lease keeper
(:mod:`.session`)."""
