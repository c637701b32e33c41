#!/bin/sh
# A single KRaft broker+controller: the configuration the harness wrote to /work (mounted),
# its storage formatted at the first start (kept across a stop or a kill of the container).
set -e
classpath='/opt/kafka/libs/*'
java -Xmx128m -cp "$classpath" kafka.tools.StorageTool format --standalone --ignore-formatted \
    --cluster-id "$KAFKA_CLUSTER_ID" --config /work/server.properties >/dev/null
# shellcheck disable=SC2086 # the JVM options are words
exec java $KAFKA_JVM_OPTIONS -cp "$classpath" kafka.Kafka /work/server.properties
