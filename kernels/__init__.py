"""Data package: the ddtree-kernels source, shipped as ddtree_deploy.kernel_source."""
