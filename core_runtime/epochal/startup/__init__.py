"""Spark start-up tuning: the JVM class-data archive, the fast Spark home, state files linked
instead of copied, and the warm-up that primes a driver's Python workers. None of it changes
what a job does, only how soon its driver is ready."""
