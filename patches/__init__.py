"""Data package: shipped as ddtree_deploy.patchsets so the installed command finds these files."""
