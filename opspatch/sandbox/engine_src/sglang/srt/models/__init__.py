"""The tiny deterministic model the stand-in decodes with."""
