"""The fault-injection suite: many seeded runs of the real pipeline under faults, each checked independently.

``make chaos`` (``python -m copier.chaos``) runs it and writes
docs/reliability.md; ``tests/test_chaos.py`` runs a short fixed set inside
``make test``. See :mod:`copier.chaos.run` for what one seed does.
"""
