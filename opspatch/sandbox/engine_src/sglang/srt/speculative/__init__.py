"""Speculative decoding: EAGLE-style chain drafting and verification."""
