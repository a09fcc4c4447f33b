"""copier's kcl layer (docs/architecture.md, "Layers")."""
