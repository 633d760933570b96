"""HTTP server, offline engine and OpenAI-shaped endpoints."""
