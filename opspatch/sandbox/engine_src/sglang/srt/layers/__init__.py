"""Token selection: greedy, temperature, top-k, top-p."""
