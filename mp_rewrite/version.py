"""The package version, readable without importing the package (setup.cfg reads it)."""

__version__ = "0.1.0"
