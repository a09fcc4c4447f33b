"""copier's core layer (docs/architecture.md, "Layers")."""
