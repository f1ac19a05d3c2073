"""The reward matrix: the import format, the DuckDB build (the single writer), reading it back,
and importers of public routing data."""
