"""A small Qwen3 target and its DFlash drafter, trained from scratch for the GPU lab (issue 23).

`train.py` is the entry point; each module owns one stage (module docstrings say which).
"""
