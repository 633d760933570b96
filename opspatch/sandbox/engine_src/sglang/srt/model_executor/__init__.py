"""CUDA graph capture (which fails for real on a host without CUDA)."""
