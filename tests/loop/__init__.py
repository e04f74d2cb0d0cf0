"""The closed-loop tier: the operator's control law driving the discrete-event simulators (`tailtune.sim`) over
minutes of simulated traffic, judged against oracles and baselines: a small seeded sample of what bench/ sweeps.
Pure and offline like tests/unit, but each case simulates a whole trace; kept apart so that `pytest tests/unit`
stays within its minute."""
