"""Configuration files: finding them and loading them into the core's models."""
