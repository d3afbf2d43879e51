"""`make demo`: vgpud end to end from a source checkout (demo.py).

Not part of the shipped package (pyproject's packages are vgpud*): it runs
the burns and the simulated driver that `make` builds in the checkout.
"""
