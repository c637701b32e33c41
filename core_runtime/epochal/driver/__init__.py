"""The driver process of a job (``python -m epochal.driver``): what it asks of its SparkSession,
the guards that stop it when it may no longer act, the runs of the job's query, and their
progress."""
