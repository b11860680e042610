"""Typed configuration: one dataclass per Hydra group."""
