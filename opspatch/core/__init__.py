"""The pure core: what a patch is and what it does to source text, with no I/O at all."""
