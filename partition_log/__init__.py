"""Segmented, replicated partition logs."""
