"""Sampling parameters and their validation."""
