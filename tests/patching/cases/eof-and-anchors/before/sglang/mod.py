"""One module-level DFLASH gate for the audit tests."""

LAST = "DFLASH"
