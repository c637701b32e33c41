"""Job control: the supervisor, the driver processes it launches and the messages between
them, the restart policy, the failure classes, fault plans and the processes of a run; and the
lease keeper that holds a job's lease for a driver started by something else."""
