"""Pure analyses for incident response and patch authors: code in, findings out, no I/O."""
