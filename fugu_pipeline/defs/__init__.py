"""The Dagster layer: thin assets, checks, sensors and resources over the core modules."""
