"""The directory the chaos suite's clock wrapper puts on PYTHONPATH, for its ``sitecustomize`` (see that module)."""
