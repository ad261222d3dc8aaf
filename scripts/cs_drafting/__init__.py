"""Harnesses of results/cs_drafting/: views the report does not print."""
