"""The state of a job, kept in its directory beside its snapshots: the layout and its lock
files, the job record, the lease (its record, swaps, fence and a session driver's hold), the
snapshot store (local or on an object store), the records of driver runs and Spark's checkpoint
with its manifests."""
