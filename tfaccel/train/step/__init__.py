"""The runner (the inner loop behind `runner_interface`) and its compiled steps."""
