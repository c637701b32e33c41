"""``format("epochal.jdbc")`` in any SparkSession, found by Spark itself
(:func:`epochal_sdk.define_default_source`)."""

from epochal_sdk import define_default_source

define_default_source(globals(), "jdbc")
