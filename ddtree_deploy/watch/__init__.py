"""What keeps a deployment proven after the deploy: the fingerprint of what was validated, the
Prometheus metrics of each validation, and the re-validation timer's units.

Placed between `rollout` (which records and acts on these) and the rooms it reads through
(`patching`, `kernel_build`, `service`, `hosts`, `config`).
"""
