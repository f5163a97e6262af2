"""verify: train the legacy and the migrated program side by side and compare."""
