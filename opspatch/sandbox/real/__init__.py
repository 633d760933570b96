"""Real SGLang in the sandbox, on the CPU: `opspatch sandbox up --engine sglang`."""
