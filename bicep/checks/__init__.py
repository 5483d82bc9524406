"""Custom checkov checks for upwell's Bicep templates (loaded with --external-checks-dir)."""
