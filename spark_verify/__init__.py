"""PySpark checkers that verify recorded operation histories at scale."""
