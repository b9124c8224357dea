"""Data package: the Hydra config tree, shipped as `ddtree_deploy.conf` for `pkg://`."""
