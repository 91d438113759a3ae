"""The package version (a module of its own, so lower layers can read it without importing
the top-level package and its public API)."""

__version__ = "0.1.0"
