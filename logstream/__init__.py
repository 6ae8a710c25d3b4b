"""logstream: real-time log anomaly detection with a StreamingLLM sink + ring cache."""

__version__ = "0.1.0"
