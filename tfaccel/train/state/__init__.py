"""The run's stored state: checkpoints, the run lock, hyperparameters, saving."""
