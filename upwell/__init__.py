"""upwell: an event-driven, serverless pipeline for research computing on Azure."""

__version__ = "0.1.0"
