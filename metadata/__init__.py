"""Cluster metadata: metadata records, the metadata image and the active controller."""
