"""The control-plane simulation: a day of an account running copier, its AWS calls against AWS's limits
(``copier.bench.sim.day``; ``python -m copier.bench.sim``)."""
