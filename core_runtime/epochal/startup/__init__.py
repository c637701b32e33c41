"""A driver's SparkSession and its start-up: the session's profile and how it is built, the JVM
class-data archive, the fast Spark home, state files linked instead of copied, and the warm-up
that primes a driver's Python workers. The tuning changes nothing of what a job does, only how
soon its driver is ready."""
