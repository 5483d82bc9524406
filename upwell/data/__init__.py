"""Data that ships with upwell: the dated price table (``prices.json``)."""
