"""A Jepsen-style chaos harness: fault injection, operation histories and their checks."""
