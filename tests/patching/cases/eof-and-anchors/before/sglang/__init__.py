"""A tiny stand-in package for engine tests."""
