"""The SLO autotuner: a pure control law, its types, and the only module that talks to Prometheus."""
