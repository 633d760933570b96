"""The serving runtime of the stand-in engine (SGLang's `srt`)."""
