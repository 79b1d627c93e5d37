"""Heads and models in other tools' formats."""
