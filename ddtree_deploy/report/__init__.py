"""Presentation for the CLI: console output, tables and the report files; only `cli` imports it."""
