"""The character tokenizer of the tiny model."""
