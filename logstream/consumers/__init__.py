"""Sources that yield LogRecords: Kafka, files (with follow mode), stdin; `parse` is the one parser."""
