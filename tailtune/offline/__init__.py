"""Offline tools beside the control law, importing it: `plan` (a config from a measured curve), `simulate` (the
operator's loop against the simulator on a trace) and `whatif` (the policies it compares), with `simobs` (the
simulator's windows read as the operator reads Prometheus). Nothing in the operator imports them."""
