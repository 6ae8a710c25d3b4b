#!/usr/bin/env bash
# Provision what the Kafka tests need (benchmarks/support/kafka_broker.py): Java 17, Maven, and the
# Apache Kafka broker jars (KRaft) resolved from Maven Central into .cache/kafka/libs.
# Maven runs with --strict-checksums (a download that does not match the checksum Central
# publishes fails), and every jar the broker runs must match its sha256 in
# .ci/kafka-jars.sha256, the full list: a jar missing, changed or added fails the run.
# Idempotent: a second run with everything in place does nothing but check.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi

libs=.cache/kafka/libs
pinned="$PWD/.ci/kafka-jars.sha256"
stamp="$libs/.resolved-$(sha256sum .ci/kafka-pom.xml | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$libs"
    # the plugin by its full coordinates: its version never depends on repository metadata
    mvn -q -B --strict-checksums -f .ci/kafka-pom.xml \
        org.apache.maven.plugins:maven-dependency-plugin:2.8:copy-dependencies \
        -DoutputDirectory="$PWD/$libs" -DincludeScope=runtime
    touch "$stamp"
fi
if ! (cd "$libs" && sha256sum --check --quiet --strict "$pinned") \
    || [[ "$(ls "$libs"/*.jar | wc -l)" != "$(wc -l <"$pinned")" ]]; then
    echo "kafka jars: $libs differs from .ci/kafka-jars.sha256 (a new pom needs a new list:" \
        "cd $libs && sha256sum *.jar >../../../.ci/kafka-jars.sha256)" >&2
    exit 1
fi
echo "kafka jars: $(ls "$libs"/*.jar | wc -l) in $libs, each matching .ci/kafka-jars.sha256"
