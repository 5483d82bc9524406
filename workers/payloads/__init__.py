"""The payload processes: one module per registered payload, plus their shared helpers."""
