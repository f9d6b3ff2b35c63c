"""The package's version, in a leaf module: low-level modules (the cache stamps, provenance) read it without
importing the package's public face (fastscore/__init__ imports the whole API)."""

__version__ = "0.1.0"
