"""Before the first step: arguments, arrays, a compiled model's settings, checks."""
