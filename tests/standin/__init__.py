"""TEST DOUBLE: a stand-in for the SGLang server, which cannot run without GPUs (see server.py)."""
