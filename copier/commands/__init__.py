"""copier's commands layer (docs/architecture.md, "Layers")."""
