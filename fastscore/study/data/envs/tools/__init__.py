"""Tool calling on BFCL items: a simulated runtime, seeded mutations of the ground-truth call
(and the call written as prose), descriptions."""
