"""The job's lease, in one place: its record (:mod:`.record`), the fence a run checks before
it acts (:mod:`.fence`), and how a session driver holds it through its lease keeper
(:mod:`.session`)."""
