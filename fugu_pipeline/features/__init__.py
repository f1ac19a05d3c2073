"""Features: encoder settings and the feature contract, the frozen encoder (and the tiny one built
locally), the content-addressed embedding cache, and routing data (matrix rows + features)."""
