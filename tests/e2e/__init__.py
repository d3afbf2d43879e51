"""Container and systemd end-to-end tests. A package, so its module names
may repeat those of tests/unit (test_systemd.py)."""
