"""Sources that yield LogRecords: Kafka, files (with follow mode), stdin; `parse` is the one parser.

Imported as `logstream.consumers` (this folder ships inside the logstream package through the
package-dir mapping in pyproject.toml). Static tools: see the README's Layout.
"""
