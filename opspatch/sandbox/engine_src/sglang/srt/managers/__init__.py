"""Scheduler, model worker, tokenizer manager and the request/batch types they share."""
