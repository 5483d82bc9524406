"""A job's life after ingest, as a lab runs it: find it, cancel it, re-run it, delete it, read its logs."""
