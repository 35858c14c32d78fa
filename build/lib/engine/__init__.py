"""S1-mini Studio inference engine."""
