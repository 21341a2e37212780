"""Tests of dp_operators.anonymity (a package, so its conftest does not shadow tests/conftest.py)."""
