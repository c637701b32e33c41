"""The state of a job, kept in its directory beside its snapshots: the layout, the job record,
the lease and its fence, the snapshot store (local or on an object store), the records of
driver runs and Spark's checkpoint as epochal checks it."""
