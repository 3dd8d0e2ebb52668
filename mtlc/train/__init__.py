"""Training: the network, the step and its objectives, local clustering, the schedule and presets, checkpoints, devices and what a run shows."""
