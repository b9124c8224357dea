"""Data package: shipped as ddtree_deploy.templates so the installed command finds these files."""
