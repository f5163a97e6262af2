"""tfmigrate: migrate TF1 multi-GPU tower training code to TF2, and verify it trains the same."""

__version__ = "0.1.0"
