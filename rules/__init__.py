"""The rule catalog: one module per rule, discovered by the engine."""
