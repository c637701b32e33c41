"""The parts of a pipeline: epochal's connectors and Spark's own sources and sinks, and the
guarantee each gives; the job context a part runs in; what each run notes about its parts."""
