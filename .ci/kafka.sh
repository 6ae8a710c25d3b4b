#!/usr/bin/env bash
# Provision what the Kafka tests need (tests/kafka_broker.py): Java 17, Maven, and the
# Apache Kafka broker jars (KRaft) resolved from Maven Central into .cache/kafka/libs.
# Idempotent: a second run with everything in place does nothing but check.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi

libs=.cache/kafka/libs
stamp="$libs/.resolved-$(sha256sum .ci/kafka-pom.xml | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$libs"
    mvn -q -B -f .ci/kafka-pom.xml dependency:copy-dependencies \
        -DoutputDirectory="$PWD/$libs" -DincludeScope=runtime
    touch "$stamp"
fi
echo "kafka jars: $(ls "$libs"/*.jar | wc -l) in $libs"
