"""A local AWS backend for tests and local runs: moto behind hypercorn on a loopback address.

This package is the only place that imports moto and hypercorn; they come
with the ``test`` extra and are not needed on production hosts. Import
:mod:`copier.local.backend` for :class:`~copier.local.backend.LocalBackend`
and the ``copier local-backend`` entry point; :mod:`copier.local.moto_patches`
holds the runtime corrections to moto that the backend applies.
"""
