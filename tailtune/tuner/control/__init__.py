"""The parts of the control law (`tailtune.tuner.law.decide`): reading, plan, gates, guards."""
