"""Alert pipeline: routing, grouping, durable outbox, notifiers."""
