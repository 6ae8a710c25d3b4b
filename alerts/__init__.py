"""Alert pipeline: routing, grouping, durable outbox, notifiers.

Imported as `logstream.alerts` (this folder ships inside the logstream package through the
package-dir mapping in pyproject.toml). Static tools: see the README's Layout.
"""
