"""Job control: the supervisor and its renewal of the lease, the driver processes it launches
and the messages between them, the restart policy, the failure classes, a job's submission and
requests; and the lease keeper process that holds a job's lease for a driver started by
something else."""
