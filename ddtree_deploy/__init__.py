"""ddtree-deploy: put DDTree speculative decoding into production on SGLang hosts."""

__version__ = "0.1.0"
