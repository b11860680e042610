"""Data: samples keyed by global index, so the order never depends on the layout."""
