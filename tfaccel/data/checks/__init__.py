"""Checks on the data before step 1: labels against the model and loss, finite values."""
