"""The judgments: pure functions from facts already read to what they mean."""
