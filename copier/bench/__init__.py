"""Measurements of copier against baselines, run by ``make bench`` (not by the tests, but for a smoke run).

Like ``copier.local``, this package is for development hosts: it imports
the local backend and is never imported by the record processor.
"""
