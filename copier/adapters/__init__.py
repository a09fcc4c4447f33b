"""copier's adapters layer (docs/architecture.md, "Layers")."""
