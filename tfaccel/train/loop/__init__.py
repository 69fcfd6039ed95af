"""The outer loop of `fit`: epochs, callbacks, validation, loop sizing, faults."""
