"""The training loop and what it reports."""
