"""Pure desired-state builders: typed inputs in, plain manifests out. No I/O, no clock, no randomness."""
