"""upwell: an event-driven, serverless pipeline for research computing on Azure."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout (or install prefix) that holds upwell/, workers/, samples/ and host.json.
REPO = Path(__file__).resolve().parent.parent
