"""Patching room: versioned SGLang patch sets, their manifests, and (later) apply/revert/audit."""
